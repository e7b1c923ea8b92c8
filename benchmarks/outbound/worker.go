// The worker side of the outbound benchmark: each worker process runs a
// transport over the shared Redis and calls the upstream until its
// deadline, recording what it saw.

package outbound

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/internal/harness/workerproc"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// spec is what the benchmark tells each worker process to do.
type spec struct {
	Scenario
	Addr, URL, Prefix string
	Goroutines        int
	StartAt, Until    time.Time
}

// Outcomes count what a fleet's callers got instead of a response.
type Outcomes struct {
	// GaveUp and Backpressure count the transport's give-ups and
	// backpressure errors.
	GaveUp, Backpressure int
	// Calls counts the calls that got an answer.
	Calls int
	// Rebooked counts the requests the transports booked again because
	// their process woke too late after their slots (a real fleet's
	// scheduling; the simulation's fake clock is never late).
	Rebooked int
	// Errors are the first of the other errors, beside the run's end.
	Errors []string
}

// call sends GET url through client until until, one request after
// another, each under the context newCtx gives, and counts in o (under mu)
// what the caller got instead of a response. A caller told to back off
// waits until the wait would fit in its budget, as the error says, before
// it tries again.
func (o *Outcomes) call(client *http.Client, url string, until time.Time, newCtx func() (context.Context, context.CancelFunc), mu *sync.Mutex) {
	for time.Now().Before(until) {
		ctx, cancel := newCtx()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		cancel()
		var bp *fleetrate.BackpressureError
		mu.Lock()
		switch {
		case err == nil:
			o.Calls++
			_ = resp.Body.Close()
		case errors.As(err, &bp):
			o.Backpressure++
		case errors.Is(err, transport.ErrGaveUp):
			o.GaveUp++
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		default:
			if len(o.Errors) < 5 {
				o.Errors = append(o.Errors, err.Error())
			}
		}
		mu.Unlock()
		if bp != nil {
			time.Sleep(max(bp.RetryAfter-bp.MaxWait, 100*time.Millisecond))
		}
	}
}

// Main runs the worker when the binary was started as one, and returns
// otherwise. Call it first in TestMain.
func Main() { workerproc.Main(workerEnv, work) }

func upstreamOf(s Scenario) transport.Upstream {
	up := transport.Upstream{
		Channel:   "ota",
		Endpoints: []transport.Endpoint{{Name: "avail", Pattern: "/avail", Limits: []fleetrate.Limit{s.Limit}, Spacing: s.Spacing}},
		Fixed:     s.Fixed,
		Headers:   transport.RateLimitHeaders{Window: s.HeaderWindow},
	}
	if s.Credential.Rate > 0 {
		up.Credential = []fleetrate.Limit{s.Credential}
	}
	return up
}

// workerLimiter returns the Limiter of a worker of s over the benchmark's
// Redis, its connections dialled and its scripts loaded, and the client
// to close when the worker is done.
func workerLimiter(s spec, up transport.Upstream) (*fleetrate.Limiter, *redis.Client, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: s.Goroutines + 4, MinIdleConns: s.Goroutines})
	store, err := redisstore.New(c, redisstore.Options{Timeout: 2 * time.Second})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	// As the README shows: dial and load the scripts before the first
	// booking, whose answer would otherwise come late.
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = store.Warm(wctx)
	cancel()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Prefix: s.Prefix, Buckets: up.Buckets()})
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return lim, c, nil
}

func work(s spec) Outcomes {
	up := upstreamOf(s.Scenario)
	lim, c, err := workerLimiter(s, up)
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	defer c.Close()
	classify, err := up.Classifier()
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	reg := prometheus.NewRegistry()
	var logger *slog.Logger
	if dir := os.Getenv(LogEnv); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return Outcomes{Errors: []string{err.Error()}}
		}
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("worker-%d.log", os.Getpid())))
		if err != nil {
			return Outcomes{Errors: []string{err.Error()}}
		}
		defer f.Close()
		logger = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	base := &http.Transport{MaxIdleConnsPerHost: s.Goroutines}
	// As the README advises against a strict window: open the connection
	// to the upstream before the first request, with one it does not
	// count, or that request goes out over a new connection, late.
	if err := warmConn(base, s.URL+warmPath); err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	tr, err := transport.New(lim, classify, transport.Options{
		Base:          stamped{base: base, log: logger},
		Logger:        logger,
		MaxRetryAfter: maxRetryAfter,
		Registerer:    reg,
	})
	if err != nil {
		return Outcomes{Errors: []string{err.Error()}}
	}
	client := &http.Client{Transport: tr}
	var (
		mu  sync.Mutex
		out Outcomes
		wg  sync.WaitGroup
	)
	time.Sleep(time.Until(s.StartAt))
	// A caller's own deadline, well past its max wait: the requests still
	// queued at the end of the run are not sent.
	newCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 30*time.Second)
	}
	for range s.Goroutines {
		wg.Go(func() { out.call(client, s.URL+"/avail", s.Until, newCtx, &mu) })
	}
	wg.Wait()
	out.Rebooked = int(counted(reg, transport.MetricLateRebooked))
	return out
}

// stamped stamps each request with the time it is handed to the
// connection (mockota.SentHeader), so that the upstream's log tells how
// long the wire took from how late the transport sent it. With a log, it
// also logs each send that took a new connection or whose write ended
// more than slowWrite after the stamp (event slow_send): the client's own
// share of the wire.
type stamped struct {
	base http.RoundTripper
	log  *slog.Logger
}

// slowWrite is how long after its stamp a request's write may end before
// stamped logs it.
const slowWrite = time.Millisecond

func (s stamped) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	stamp := time.Now()
	req.Header.Set(mockota.SentHeader, strconv.FormatInt(stamp.UnixNano(), 10))
	if s.log == nil {
		return s.base.RoundTrip(req)
	}
	var got, wrote atomic.Int64
	var reused atomic.Bool
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			got.Store(int64(time.Since(stamp)))
			reused.Store(i.Reused)
		},
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(int64(time.Since(stamp))) },
	}))
	resp, err := s.base.RoundTrip(req)
	if w := time.Duration(wrote.Load()); w > slowWrite || !reused.Load() {
		s.log.Info("slow_send", slog.Time("stamp", stamp), slog.Bool("reused", reused.Load()),
			slog.Duration("got_conn", time.Duration(got.Load())), slog.Duration("wrote", w))
	}
	return resp, err
}
