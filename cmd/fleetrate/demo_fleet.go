package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/mockota"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

// The two ways the demo runs its fleet.
const (
	modeNaive  = "naive"
	modeShared = "shared"
)

// demoHotels is how many hotels the workload spreads over; the mock's
// hidden limit is kept per hotel.
const demoHotels = 4

// fleetSpec is what one process of the fleet runs: the in-process fleet,
// or one share of it in a child process.
type fleetSpec struct {
	Mode        string
	OTA         string      // the mock OTA's base URL
	Workers     int         // workers in this process
	FirstWorker int         // index of this process's first worker in the fleet
	Start       time.Time   // when the workers begin
	Until       time.Time   // when they stop sending
	Share       float64     // shared mode: fraction of each documented limit to pace at
	Rate        float64     // naive mode: each worker's own bucket, per second
	Redis       string      // shared mode: Redis URL; empty means the in-memory store
	Prefix      string      // shared mode: store key prefix, unique per run
	status      *demoStatus // in-process shared run: the status page, if any
}

// fleetReport is what a fleet process reports: the outcome of each request
// it tried and, for those sent, how long each waited before its first send.
type fleetReport struct {
	Outcomes map[string]int  `json:"outcomes"`
	Waits    []time.Duration `json:"waits"`
}

// Request outcomes, as counted in fleetReport.Outcomes.
const (
	outcomeOK           = "ok"           // 2xx
	outcomeLimited      = "limited"      // the caller got a 429 back
	outcomeGaveUp       = "gave_up"      // the transport gave up after its attempts
	outcomeBackpressure = "backpressure" // refused: the wait exceeded the max wait
	outcomeCut          = "cut"          // not sent: its turn fell after the end of the run
	outcomeError        = "error"        // anything else
)

func (r *fleetReport) merge(o fleetReport) {
	if r.Outcomes == nil {
		r.Outcomes = map[string]int{}
	}
	for k, v := range o.Outcomes {
		r.Outcomes[k] += v
	}
	r.Waits = append(r.Waits, o.Waits...)
}

// demoUpstream paces the mock's documented limits at share of each, with
// burst 1, the strictest reading, since the mock counts a sliding window.
func demoUpstream(cfg mockota.Config, share float64) transport.Upstream {
	up := transport.Upstream{Channel: "booking_com"}
	if cfg.Credential > 0 {
		up.Credential = []fleetrate.Limit{fleetrate.PerSecond(share*float64(cfg.Credential), 1)}
	}
	for _, e := range cfg.Endpoints {
		up.Endpoints = append(up.Endpoints, transport.Endpoint{
			Name:    e.Name,
			Pattern: e.Pattern,
			Limits:  []fleetrate.Limit{fleetrate.PerSecond(share*float64(e.Limit), 1)},
		})
	}
	return up
}

// newDemoRequest returns worker's turn-th request, for a random hotel:
// availability, reservations and rate plans in the ratio 4:2:1 of their
// documented limits, in a rotation each worker starts at its own place.
func newDemoRequest(ctx context.Context, base string, worker, turn int, rng *rand.Rand) (*http.Request, string, error) {
	hotel := fmt.Sprintf("hotel-%d", 1+rng.IntN(demoHotels))
	ctx = transport.WithEntity(ctx, hotel)
	switch k := (worker*3 + turn) % 7; {
	case k < 4:
		body := fmt.Sprintf(`{"hotel":%q,"rooms":%d}`, hotel, 1+rng.IntN(9))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/hotels/"+hotel+"/availability", bytes.NewReader([]byte(body)))
		return req, "availability", err
	case k < 6:
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/hotels/"+hotel+"/reservations", nil)
		return req, "reservations", err
	default:
		body := fmt.Sprintf(`{"hotel":%q,"plan":"BAR","price":%d}`, hotel, 80+rng.IntN(120))
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/hotels/"+hotel+"/rates", bytes.NewReader([]byte(body)))
		return req, "rates", err
	}
}

type sentAtKey struct{}

// sendClock records, in the *time.Time the request context carries, when
// the request was first handed to the network: its wait ends there.
type sendClock struct{ base http.RoundTripper }

// RoundTrip notes the first send time and passes the request on.
func (s sendClock) RoundTrip(r *http.Request) (*http.Response, error) {
	if p, ok := r.Context().Value(sentAtKey{}).(*time.Time); ok && p.IsZero() {
		*p = time.Now()
	}
	return s.base.RoundTrip(r)
}

// runFleet runs spec.Workers workers until spec.Until and reports what they
// did. The mock OTA keeps its own, authoritative, counts.
func runFleet(ctx context.Context, spec fleetSpec) (fleetReport, error) {
	net := &http.Transport{MaxIdleConnsPerHost: max(spec.Workers, 2), IdleConnTimeout: 30 * time.Second}
	defer net.CloseIdleConnections()
	base := sendClock{base: net}

	var store fleetrate.Store
	var up transport.Upstream
	var classify transport.Classify
	if spec.Mode == modeShared {
		up = demoUpstream(mockota.Demo(), spec.Share)
		var err error
		if classify, err = up.Classifier(); err != nil {
			return fleetReport{}, err
		}
		if spec.Redis == "" {
			store = memstore.New(memstore.Options{})
		} else {
			rs, closeRedis, err := openRedis(ctx, spec.Redis)
			if err != nil {
				return fleetReport{}, err
			}
			defer closeRedis()
			store = rs
		}
		if spec.status != nil {
			store = spec.status.attach(store, spec.Prefix)
		}
	}

	// Every worker builds its own client, as separate services would;
	// in shared mode only the store is common.
	clients := make([]func(*http.Request) (*http.Response, time.Duration, error), spec.Workers)
	for i := range clients {
		switch spec.Mode {
		case modeShared:
			lim, err := fleetrate.New(store, fleetrate.Config{Prefix: spec.Prefix, Buckets: up.Buckets()})
			if err != nil {
				return fleetReport{}, err
			}
			topts := transport.Options{Base: base, Logger: slog.New(slog.DiscardHandler)}
			if spec.status != nil {
				topts.Registerer = spec.status.registry
			}
			tr, err := transport.New(lim, classify, topts)
			if err != nil {
				return fleetReport{}, err
			}
			client := &http.Client{Transport: tr}
			clients[i] = func(req *http.Request) (*http.Response, time.Duration, error) {
				start := time.Now()
				var sent time.Time
				resp, err := client.Do(req.WithContext(context.WithValue(req.Context(), sentAtKey{}, &sent)))
				if sent.IsZero() {
					return resp, -1, err
				}
				return resp, sent.Sub(start), err
			}
		default:
			lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(spec.Rate, 1)}})
			if err != nil {
				return fleetReport{}, err
			}
			client := &http.Client{Transport: base}
			clients[i] = func(req *http.Request) (*http.Response, time.Duration, error) {
				start := time.Now()
				if _, err := lim.Wait(req.Context(), "local"); err != nil {
					return nil, -1, err
				}
				wait := time.Since(start)
				resp, err := client.Do(req)
				return resp, wait, err
			}
		}
	}

	if d := time.Until(spec.Start); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return fleetReport{}, ctx.Err()
		}
	}
	runCtx, cancel := context.WithDeadline(ctx, spec.Until)
	defer cancel()

	var mu sync.Mutex
	report := fleetReport{Outcomes: map[string]int{}}
	var wg sync.WaitGroup
	for i, do := range clients {
		rng := rand.New(rand.NewPCG(uint64(spec.Start.UnixNano()), uint64(spec.FirstWorker+i)))
		wg.Go(func() {
			var mine fleetReport
			mine.Outcomes = map[string]int{}
			for turn := 0; runCtx.Err() == nil; turn++ {
				req, _, err := newDemoRequest(runCtx, spec.OTA, spec.FirstWorker+i, turn, rng)
				if err != nil {
					mine.Outcomes[outcomeError]++
					break
				}
				resp, wait, err := do(req)
				if wait >= 0 {
					mine.Waits = append(mine.Waits, wait)
				}
				outcome := classifyOutcome(resp, err)
				mine.Outcomes[outcome]++
				if resp != nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if outcome == outcomeCut {
					break // this worker's next turn is after the end
				}
				if outcome == outcomeLimited && spec.Mode == modeNaive {
					// A naive worker honours Retry-After by itself alone.
					d, _ := transport.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now(), time.Until(spec.Until))
					select {
					case <-time.After(d):
					case <-runCtx.Done():
					}
				}
			}
			mu.Lock()
			report.merge(mine)
			mu.Unlock()
		})
	}
	wg.Wait()
	return report, nil
}

// classifyOutcome names what happened to one request.
func classifyOutcome(resp *http.Response, err error) string {
	switch {
	case err == nil && resp.StatusCode < 300:
		return outcomeOK
	case err == nil && resp.StatusCode == http.StatusTooManyRequests:
		return outcomeLimited
	case err == nil:
		return outcomeError
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return outcomeCut
	case errors.Is(err, transport.ErrGaveUp):
		return outcomeGaveUp
	case errors.Is(err, fleetrate.ErrBackpressure):
		// The run's deadline lowers the max wait as the end nears; a
		// refusal under a lowered max wait means the turn fell after the
		// end of the run.
		var bp *fleetrate.BackpressureError
		if errors.As(err, &bp) && bp.MaxWait < fleetrate.DefaultMaxWait {
			return outcomeCut
		}
		return outcomeBackpressure
	}
	return outcomeError
}

// openRedis connects to the Redis at url and returns a store over it.
func openRedis(ctx context.Context, url string) (*redisstore.Store, func(), error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis %q: %w", url, err)
	}
	redisstore.SetLogger(slog.Default()) // go-redis's own lines: structured, one a second
	client := redis.NewClient(opts)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("--redis %q: %w: %w", url, fleetrate.ErrStoreUnavailable, err)
	}
	store, err := redisstore.New(client, redisstore.Options{Timeout: time.Second})
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return store, func() { client.Close() }, nil
}
