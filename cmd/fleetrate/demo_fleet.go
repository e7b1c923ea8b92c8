package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

// The three ways the demo runs its fleet, side by side.
const (
	modeNaive    = "naive"    // each worker paces itself with a local bucket
	modeShared   = "shared"   // shared buckets at fixed rates (transport.Upstream.Fixed)
	modeAdaptive = "adaptive" // shared buckets whose rates adapt to 429s (the transport's default)
)

// demoModes are the fleets of the demo, in the order printed.
var demoModes = []string{modeNaive, modeShared, modeAdaptive}

// demoHotels is how many hotels the workload spreads over.
const demoHotels = 4

// demoHidden is the mock OTA's hidden limit in the demo: the whole
// reservations endpoint admits 8 requests per second, not the documented
// 10. Pacing at 90 % of the documented limit (9/s) runs into it, and one
// adaptive decrease (x0.85, 7.65/s) goes below it.
var demoHidden = mockota.Hidden{Endpoint: "reservations", Limit: 8, RetryAfter: time.Second}

// demoOTA returns the mock OTA's configuration in the demo: mockota.Demo's
// documented limits, with demoHidden as its hidden limit.
func demoOTA() mockota.Config {
	cfg := mockota.Demo()
	h := demoHidden
	cfg.Hidden = &h
	return cfg
}

// fleetSpec is what one process of the fleet runs: the in-process fleet,
// or one share of it in a child process.
type fleetSpec struct {
	Mode        string
	OTA         string      // the mock OTA's base URL
	Workers     int         // workers in this process
	FirstWorker int         // index of this process's first worker in the fleet
	Start       time.Time   // when the workers begin
	Until       time.Time   // when they stop starting requests
	Share       float64     // shared modes: fraction of each documented limit to pace at
	Rate        float64     // naive mode: each worker's own bucket, per second
	Redis       string      // shared modes: Redis URL; empty means the in-memory store
	Prefix      string      // shared modes: store key prefix, unique per run
	status      *demoStatus // in-process adaptive run: the status page, if any
}

// fleetReport is what a fleet process reports: the outcome of each request
// its workers made, how many times they sent one (retries included), and,
// for each request sent, how long it waited before its first send.
type fleetReport struct {
	Outcomes map[string]int  `json:"outcomes"`
	Sends    int             `json:"sends"`
	Waits    []time.Duration `json:"waits"`
}

// Request outcomes, as counted in fleetReport.Outcomes. Every request the
// workers make has exactly one.
const (
	outcomeOK           = "ok"           // answered 2xx
	outcomeLimited      = "limited"      // the worker got a 429 back
	outcomeGaveUp       = "gave_up"      // sent, answered 429, and the transport stopped retrying
	outcomeBackpressure = "backpressure" // not sent: its wait exceeded the max wait
	outcomeCut          = "cut"          // not sent: its turn came after the end of the run
	outcomeError        = "error"        // anything else
)

func (r *fleetReport) merge(o fleetReport) {
	if r.Outcomes == nil {
		r.Outcomes = map[string]int{}
	}
	for k, v := range o.Outcomes {
		r.Outcomes[k] += v
	}
	r.Sends += o.Sends
	r.Waits = append(r.Waits, o.Waits...)
}

// requests is how many requests the workers made.
func (r fleetReport) requests() int {
	n := 0
	for _, v := range r.Outcomes {
		n += v
	}
	return n
}

// demoUpstream paces the mock's documented limits at share of each, with
// burst 1, the strictest reading, since the mock counts a sliding window.
// fixed turns adaptive pacing off.
func demoUpstream(cfg mockota.Config, share float64, fixed bool) transport.Upstream {
	up := transport.Upstream{Channel: "booking_com", Fixed: fixed}
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

// demoAdaptive is the adaptive pacing of the demo: the defaults, except
// that each worker's transport reads the shared effective rate every
// 250 ms instead of every 2 s, since every worker stands for a process
// and a run lasts seconds, not hours.
var demoAdaptive = transport.Adaptive{Refresh: 250 * time.Millisecond}

// demoMix is the workload: each worker's requests go to the endpoints in
// turn, in these proportions, out of demoMixTotal. Reservations get 3 of
// 7, so that the shared fleets would send them faster than 9/s.
var demoMix = []struct {
	endpoint string
	parts    int
}{{"availability", 3}, {"reservations", 3}, {"rates", 1}}

const demoMixTotal = 7

// newDemoRequest returns worker's turn-th request, for a random hotel, on
// the endpoint demoMix gives it, in a rotation each worker starts at its
// own place.
func newDemoRequest(ctx context.Context, base string, worker, turn int, rng *rand.Rand) (*http.Request, error) {
	hotel := fmt.Sprintf("hotel-%d", 1+rng.IntN(demoHotels))
	ctx = transport.WithEntity(ctx, hotel)
	k := (worker*3 + turn) % demoMixTotal
	endpoint := demoMix[len(demoMix)-1].endpoint
	for _, m := range demoMix {
		if k < m.parts {
			endpoint = m.endpoint
			break
		}
		k -= m.parts
	}
	path := base + "/v1/hotels/" + hotel + "/" + endpoint
	switch endpoint {
	case "availability":
		body := fmt.Sprintf(`{"hotel":%q,"rooms":%d}`, hotel, 1+rng.IntN(9))
		return http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader([]byte(body)))
	case "reservations":
		return http.NewRequestWithContext(ctx, http.MethodGet, path, nil)
	default:
		body := fmt.Sprintf(`{"hotel":%q,"plan":"BAR","price":%d}`, hotel, 80+rng.IntN(120))
		return http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader([]byte(body)))
	}
}

// hiddenCap is the most ok/s a fleet whose requests all end ok can reach
// under the demo's mix: the hidden limit over its endpoint's share of the
// requests.
func hiddenCap() float64 {
	for _, m := range demoMix {
		if m.endpoint == demoHidden.Endpoint {
			return float64(demoHidden.Limit) * demoMixTotal / float64(m.parts)
		}
	}
	return math.Inf(1)
}

type sentAtKey struct{}

// sendClock is the network under every client of a fleet process. It
// counts each send, records in the *time.Time the request context carries
// when the request was first sent (its wait ends there), and lets a
// request it sends finish after the end of the run: the run's deadline
// stops workers from starting and waiting, never cuts an answer the OTA has
// counted, so that the workers count what the OTA counts.
type sendClock struct {
	base  http.RoundTripper
	sends atomic.Int64
}

// RoundTrip sends r unless its context is done, noting the first send.
func (s *sendClock) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := r.Context().Err(); err != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, err
	}
	if p, ok := r.Context().Value(sentAtKey{}).(*time.Time); ok && p.IsZero() {
		*p = time.Now()
	}
	s.sends.Add(1)
	return s.base.RoundTrip(r.WithContext(context.WithoutCancel(r.Context())))
}

// naivePacer is a naive worker's client: its own local bucket, then send.
type naivePacer struct {
	lim  *fleetrate.Limiter
	base http.RoundTripper
}

// RoundTrip waits for the worker's own bucket and sends r.
func (p naivePacer) RoundTrip(r *http.Request) (*http.Response, error) {
	if _, err := p.lim.Wait(r.Context(), "local"); err != nil {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, err
	}
	return p.base.RoundTrip(r)
}

// runFleet runs spec.Workers workers until spec.Until and reports what they
// did. The mock OTA keeps its own, authoritative, counts.
func runFleet(ctx context.Context, spec fleetSpec) (fleetReport, error) {
	network := &http.Transport{MaxIdleConnsPerHost: max(spec.Workers, 2), IdleConnTimeout: 30 * time.Second}
	defer network.CloseIdleConnections()
	clock := &sendClock{base: network}
	clients, closeStore, err := fleetClients(ctx, spec, clock)
	if err != nil {
		return fleetReport{}, err
	}
	defer closeStore()
	if err := sleepUntil(ctx, spec.Start); err != nil {
		return fleetReport{}, err
	}
	report := runWorkers(ctx, spec, clients)
	report.Sends = int(clock.sends.Load())
	return report, nil
}

// fleetClients builds one HTTP client per worker over clock. Every worker
// builds its own client, as separate services would; in the shared modes
// only the store is common.
func fleetClients(ctx context.Context, spec fleetSpec, clock *sendClock) ([]*http.Client, func(), error) {
	clients := make([]*http.Client, spec.Workers)
	if spec.Mode == modeNaive {
		for i := range clients {
			lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(spec.Rate, 1)}})
			if err != nil {
				return nil, nil, err
			}
			clients[i] = &http.Client{Transport: naivePacer{lim: lim, base: clock}}
		}
		return clients, func() {}, nil
	}
	up := demoUpstream(demoOTA(), spec.Share, spec.Mode == modeShared)
	classify, err := up.Classifier()
	if err != nil {
		return nil, nil, err
	}
	store, closeStore, err := sharedStore(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	topts := transport.Options{Base: clock, Logger: slog.New(slog.DiscardHandler), Adaptive: demoAdaptive}
	if spec.status != nil {
		topts.Registerer = spec.status.registry
	}
	for i := range clients {
		lim, err := fleetrate.New(store, fleetrate.Config{Prefix: spec.Prefix, Buckets: up.Buckets()})
		if err != nil {
			closeStore()
			return nil, nil, err
		}
		tr, err := transport.New(lim, classify, topts)
		if err != nil {
			closeStore()
			return nil, nil, err
		}
		clients[i] = &http.Client{Transport: tr}
	}
	return clients, closeStore, nil
}

// sharedStore opens the shared modes' store: in memory, or Redis. With a
// status page, the store is the page's.
func sharedStore(ctx context.Context, spec fleetSpec) (fleetrate.Store, func(), error) {
	var store fleetrate.Store = memstore.New(memstore.Options{})
	closeStore := func() {}
	if spec.Redis != "" {
		rs, closeRedis, err := openRedis(ctx, spec.Redis)
		if err != nil {
			return nil, nil, err
		}
		store, closeStore = rs, closeRedis
	}
	if spec.status != nil {
		store = spec.status.attach(store, spec.Prefix)
	}
	return store, closeStore, nil
}

// sleepUntil waits until t, or until ctx is done.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runWorkers runs one worker per client until spec.Until and merges their
// reports.
func runWorkers(ctx context.Context, spec fleetSpec, clients []*http.Client) fleetReport {
	runCtx, cancel := context.WithDeadline(ctx, spec.Until)
	defer cancel()
	var mu sync.Mutex
	report := fleetReport{Outcomes: map[string]int{}}
	var wg sync.WaitGroup
	for i, client := range clients {
		w := demoWorker{spec: spec, index: spec.FirstWorker + i, client: client,
			rng: rand.New(rand.NewPCG(uint64(spec.Start.UnixNano()), uint64(spec.FirstWorker+i)))}
		wg.Go(func() {
			mine := w.run(runCtx)
			mu.Lock()
			report.merge(mine)
			mu.Unlock()
		})
	}
	wg.Wait()
	return report
}

// demoWorker is one worker of a fleet: it makes requests one after the
// other until the run ends.
type demoWorker struct {
	spec   fleetSpec
	index  int
	client *http.Client
	rng    *rand.Rand
}

// run makes requests until ctx is done or a turn falls after the end.
func (w demoWorker) run(ctx context.Context) fleetReport {
	mine := fleetReport{Outcomes: map[string]int{}}
	for turn := 0; ctx.Err() == nil; turn++ {
		req, err := newDemoRequest(ctx, w.spec.OTA, w.index, turn, w.rng)
		if err != nil {
			mine.Outcomes[outcomeError]++
			break
		}
		outcome, wait, retryAfter := w.do(req)
		mine.Outcomes[outcome]++
		if wait >= 0 {
			mine.Waits = append(mine.Waits, wait)
		}
		if outcome == outcomeCut {
			break // this worker's next turn is after the end
		}
		if outcome == outcomeLimited && w.spec.Mode == modeNaive {
			// A naive worker honours Retry-After by itself alone.
			d, _ := transport.ParseRetryAfter(retryAfter, time.Now(), time.Until(w.spec.Until))
			_ = sleepUntil(ctx, time.Now().Add(d))
		}
	}
	return mine
}

// do sends one request and returns its outcome, how long it waited before
// its first send (-1 when never sent) and the Retry-After of a 429.
func (w demoWorker) do(req *http.Request) (outcome string, wait time.Duration, retryAfter string) {
	start := time.Now()
	var sent time.Time
	resp, err := w.client.Do(req.WithContext(context.WithValue(req.Context(), sentAtKey{}, &sent)))
	wait = -1
	if !sent.IsZero() {
		wait = sent.Sub(start)
	}
	if resp != nil {
		retryAfter = resp.Header.Get(transport.HeaderRetryAfter)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return classifyOutcome(resp, err, !sent.IsZero()), wait, retryAfter
}

// classifyOutcome names what happened to one request, sent or not.
func classifyOutcome(resp *http.Response, err error, sent bool) string {
	switch {
	case err == nil && resp.StatusCode < 300:
		return outcomeOK
	case err == nil && resp.StatusCode == http.StatusTooManyRequests:
		return outcomeLimited
	case err == nil:
		return outcomeError
	case sent && (errors.Is(err, transport.ErrGaveUp) || errors.Is(err, fleetrate.ErrBackpressure) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		// Answered 429, then no retry: attempts spent, or the next one
		// could not be booked before the end of the run.
		return outcomeGaveUp
	case sent:
		return outcomeError
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		return outcomeCut
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

// openRedis connects to the Redis at url (any URL "fleetrate serve"
// takes) and returns a store over it. Errors name the URL without its
// password.
func openRedis(ctx context.Context, url string) (*redisstore.Store, func(), error) {
	client, name, err := newServeRedisClient(url)
	if err != nil {
		return nil, nil, fmt.Errorf("--redis: %w", err)
	}
	redisstore.SetLogger(slog.Default()) // go-redis's own lines: structured, one a second
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := pingRedis(pctx, client); err != nil {
		client.Close()
		if refusedSetup(err) {
			return nil, nil, refused(name, err)
		}
		// Not ErrStoreUnavailable's text, whose "fleetrate:" main's own
		// prefix already gives: the line would read it twice.
		return nil, nil, fmt.Errorf("--redis %s: redis does not answer: %w", name, err)
	}
	store, err := redisstore.New(client, serveStoreOptions(url, true, time.Second))
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return store, func() { client.Close() }, nil
}
