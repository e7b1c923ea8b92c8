package transport_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// boundedUpstream counts the requests in flight at each instant and
// answers 429 past its bound; each request takes latency(i) to answer,
// i counting the requests.
type boundedUpstream struct {
	bound   int
	latency func(i int) time.Duration

	mu                sync.Mutex
	n, now, max, over int
}

func (u *boundedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.now++
	i := u.n
	u.n++
	u.max = max(u.max, u.now)
	past := u.now > u.bound
	if past {
		u.over++
	}
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.now--
		u.mu.Unlock()
	}()
	if past {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	time.Sleep(u.latency(i))
	_, _ = io.WriteString(w, "ok")
}

// stats returns the requests served, the most in flight at once, and how
// many came past the bound.
func (u *boundedUpstream) stats() (n, most, over int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n, u.max, u.over
}

// boundedSetup builds a limiter over store with cfg's max wait and lease
// and a transport over base, with metrics in a registry of its own.
func boundedSetup(t *testing.T, store fleetrate.Store, up transport.Upstream, base http.RoundTripper, cfg fleetrate.Config, opts transport.Options) (*transport.Transport, *fleetrate.Limiter, *prometheus.Registry) {
	t.Helper()
	cfg.Buckets = up.Buckets()
	lim, err := fleetrate.New(store, cfg)
	if err != nil {
		t.Fatalf("fleetrate.New: %v", err)
	}
	classify, err := up.Classifier()
	if err != nil {
		t.Fatalf("Classifier: %v", err)
	}
	reg := prometheus.NewRegistry()
	opts.Base, opts.Registerer = base, reg
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	tr, err := transport.New(lim, classify, opts)
	if err != nil {
		t.Fatalf("transport.New: %v", err)
	}
	return tr, lim, reg
}

// llmUpstream is an upstream whose endpoints bound requests in flight:
// each endpoint's bound is epBound, the credential's credBound (0: none).
func llmUpstream(epBound, credBound int64) transport.Upstream {
	many := []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}
	return transport.Upstream{
		Channel:            "llm",
		Credential:         many,
		CredentialInFlight: credBound,
		Endpoints: []transport.Endpoint{
			{Name: "chat", Pattern: "/chat", Limits: many, InFlight: epBound},
			{Name: "embed", Pattern: "/embed", Limits: many, InFlight: epBound},
		},
	}
}

// TestInFlightBoundHolds: 24 callers, each sending 6 requests of varying
// latency (10 ms to 2 s) at once, never have more in flight than the bound
// the upstream enforces, whether it is the endpoint's or the credential's
// (across two endpoints); no request meets a 429, none is refused, and
// every permit is back at the end.
func TestInFlightBoundHolds(t *testing.T) {
	for _, tc := range []struct {
		name            string
		ep, cred, bound int64
		paths           []string
	}{
		{name: "endpoint", ep: 3, bound: 3, paths: []string{"/chat"}},
		{name: "credential", cred: 4, bound: 4, paths: []string{"/chat", "/embed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, 2))
				lat := make([]time.Duration, 24*6)
				for i := range lat {
					lat[i] = 10*time.Millisecond + time.Duration(rng.Int64N(int64(2*time.Second)))
				}
				up := &boundedUpstream{bound: int(tc.bound), latency: func(i int) time.Duration { return lat[i] }}
				tr, _, reg := boundedSetup(t, memstore.New(memstore.Options{}), llmUpstream(tc.ep, tc.cred), inMemory(up),
					fleetrate.Config{MaxWait: 5 * time.Minute}, transport.Options{MaxWait: 5 * time.Minute, MaxAttempts: 1})
				var wg sync.WaitGroup
				errs := make(chan error, 24*6)
				for c := range 24 {
					wg.Go(func() {
						for i := range 6 {
							resp, err := get(t, context.Background(), tr, tc.paths[(c+i)%len(tc.paths)])
							if err == nil && resp.StatusCode != http.StatusOK {
								t.Errorf("status %d", resp.StatusCode)
							}
							errs <- err
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if err != nil {
						t.Fatalf("request failed: %v", err)
					}
				}
				n, most, over := up.stats()
				if n != 24*6 || most > int(tc.bound) || over != 0 {
					t.Fatalf("served %d, at most %d in flight, %d past the bound; want %d, <= %d, 0", n, most, over, 24*6, tc.bound)
				}
				if most < int(tc.bound) {
					t.Errorf("at most %d in flight: the bound %d was never used whole", most, tc.bound)
				}
				if h, w := gauge(t, reg, transport.MetricPermitsHeld), gauge(t, reg, transport.MetricPermitsWaiting); h != 0 || w != 0 {
					t.Errorf("held %v, waiting %v at the end; want 0, 0", h, w)
				}
			})
		})
	}
}

// TestInFlightBoundOverTheNetwork runs the bound through net/http against
// an httptest server, on the wall clock: 8 callers, 4 requests each,
// latencies of 5 to 30 ms, a bound of 2.
func TestInFlightBoundOverTheNetwork(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	lat := make([]time.Duration, 8*4)
	for i := range lat {
		lat[i] = 5*time.Millisecond + time.Duration(rng.Int64N(int64(25*time.Millisecond)))
	}
	up := &boundedUpstream{bound: 2, latency: func(i int) time.Duration { return lat[i] }}
	srv := httptest.NewServer(up)
	defer srv.Close()
	tr, _, _ := boundedSetup(t, memstore.New(memstore.Options{}), llmUpstream(2, 0), http.DefaultTransport,
		fleetrate.Config{MaxWait: time.Minute}, transport.Options{MaxWait: time.Minute, MaxAttempts: 1})
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 4 {
				resp, err := client.Get(srv.URL + "/chat")
				if err != nil {
					t.Errorf("get: %v", err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if n, most, over := up.stats(); n != 32 || most > 2 || over != 0 {
		t.Fatalf("served %d, at most %d in flight, %d past the bound; want 32, <= 2, 0", n, most, over)
	}
}

// TestPermitEndsWithTheBody: with a bound of 1, a response body read to
// its end (not closed) or closed (not read) gives the permit back at
// once, so the next request goes out without waiting; so does a failed
// round trip. A request sent while the permit is held waits for it.
func TestPermitEndsWithTheBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(*http.Response)
	}{
		{"read to EOF", func(r *http.Response) { _, _ = io.Copy(io.Discard, r.Body) }},
		{"closed unread", func(r *http.Response) { _ = r.Body.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				up := &boundedUpstream{bound: 1, latency: func(int) time.Duration { return 0 }}
				tr, _, reg := boundedSetup(t, memstore.New(memstore.Options{}), llmUpstream(1, 0), inMemory(up),
					fleetrate.Config{MaxWait: time.Minute}, transport.Options{MaxWait: time.Minute, MaxAttempts: 1})
				req, _ := http.NewRequest(http.MethodGet, "http://llm.test/chat", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if h := gauge(t, reg, transport.MetricPermitsHeld); h != 1 {
					t.Fatalf("held %v while the body is out; want 1", h)
				}
				// A second request waits while the body is out.
				start := time.Now()
				done := make(chan time.Duration)
				go func() {
					_, err := get(t, context.Background(), tr, "/chat")
					if err != nil {
						t.Errorf("second request: %v", err)
					}
					done <- time.Since(start)
				}()
				time.Sleep(3 * time.Second)
				synctest.Wait()
				select {
				case <-done:
					t.Fatal("the second request went out while the first's body was out")
				default:
				}
				tc.end(resp)
				if waited := <-done; waited != 3*time.Second {
					t.Errorf("the second request waited %v; want 3s, the time the body was out", waited)
				}
				if h := gauge(t, reg, transport.MetricPermitsHeld); h != 0 {
					t.Errorf("held %v at the end; want 0", h)
				}
			})
		})
	}
}

// TestFailedRoundTripPermit: a round trip that fails before its request
// is written (no connection) gives its permit back at once, so the next
// request goes out without waiting; one that fails after (a reset, a
// timeout), or through a base transport that reports no trace, may still
// be running upstream, so its permit lapses at the end of its lease and
// the next request waits exactly that long, on the store's clock; the
// lapse is counted with cause "failed_after_send".
func TestFailedRoundTripPermit(t *testing.T) {
	const ttl = 3 * time.Second
	for _, tc := range []struct {
		name  string
		trace func(*httptrace.ClientTrace) // the base's calls before it fails
		wait  time.Duration
	}{
		{"before it is written", func(ct *httptrace.ClientTrace) { ct.GetConn("llm.test:80") }, 0},
		{"after it is written", func(ct *httptrace.ClientTrace) { ct.GetConn("llm.test:80"); ct.WroteHeaders() }, ttl},
		{"with no trace", func(*httptrace.ClientTrace) {}, ttl},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int32
				base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
					if calls.Add(1) == 1 {
						tc.trace(httptrace.ContextClientTrace(r.Context()))
						return nil, io.ErrUnexpectedEOF
					}
					return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: r}, nil
				})
				tr, _, reg := boundedSetup(t, memstore.New(memstore.Options{}), llmUpstream(1, 0), base,
					fleetrate.Config{MaxWait: time.Minute, PermitTTL: ttl}, transport.Options{MaxWait: time.Minute, MaxAttempts: 1})
				if _, err := get(t, context.Background(), tr, "/chat"); err == nil {
					t.Fatal("a failed round trip returned no error")
				}
				start := time.Now()
				if _, err := get(t, context.Background(), tr, "/chat"); err != nil {
					t.Fatal(err)
				}
				if waited := time.Since(start); waited != tc.wait {
					t.Errorf("the next request waited %v; want %v", waited, tc.wait)
				}
				if h := gauge(t, reg, transport.MetricPermitsHeld); h != 0 {
					t.Errorf("held %v; want 0", h)
				}
				lapsed := 0.0
				if tc.wait > 0 {
					lapsed = 1
				}
				if n := lapsedOf(t, reg, "failed_after_send"); n != lapsed {
					t.Errorf("lapsed (failed_after_send) %v; want %v", n, lapsed)
				}
			})
		})
	}
}

// lapsedOf returns the lapsed permits counted in reg with the cause.
func lapsedOf(t *testing.T, reg *prometheus.Registry, cause string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != transport.MetricPermitsLapsed {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "cause" && l.GetValue() == cause {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// TestTimedOutRequestsKeepTheBound: callers whose timeout is shorter than
// the upstream's answer give up on their requests, which the upstream
// (like many) goes on running and counting. Over net/http, 6 callers with
// a bound of 2 never put more than 2 in flight at it: a timed-out
// request's permit lapses at the end of its lease, not when its caller
// gives up.
func TestTimedOutRequestsKeepTheBound(t *testing.T) {
	up := &boundedUpstream{bound: 2, latency: func(i int) time.Duration {
		if i%3 == 0 {
			return 400 * time.Millisecond // past the callers' timeout
		}
		return 10 * time.Millisecond
	}}
	srv := httptest.NewServer(up)
	defer srv.Close()
	tr, _, _ := boundedSetup(t, memstore.New(memstore.Options{}), llmUpstream(2, 0), http.DefaultTransport,
		fleetrate.Config{MaxWait: time.Minute, PermitTTL: time.Second}, transport.Options{MaxWait: time.Minute, MaxAttempts: 1})
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	var timedOut atomic.Int32
	for range 6 {
		wg.Go(func() {
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/chat", nil)
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
				if errors.Is(err, context.DeadlineExceeded) {
					timedOut.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond) // the last abandoned requests end upstream
	n, most, over := up.stats()
	t.Logf("%d requests reached the upstream, %d timed out at the callers, at most %d in flight", n, timedOut.Load(), most)
	if most > 2 || over != 0 {
		t.Fatalf("at most %d in flight, %d past the bound; want <= 2, 0", most, over)
	}
	if timedOut.Load() == 0 {
		t.Fatal("no request timed out: the test proved nothing")
	}
}

// TestUnclosedBodyLapses: a response body dropped without being read to
// its end or closed is reported (log and metric) once collected, its
// permit is no longer renewed, and it comes back exactly when its lease
// ends, on the store's clock.
func TestUnclosedBodyLapses(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_800_000_000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := memstore.New(memstore.Options{Clock: clock})
	msgs := make(chan string, 16)
	up := &boundedUpstream{bound: 1, latency: func(int) time.Duration { return 0 }}
	tr, lim, reg := boundedSetup(t, store, llmUpstream(1, 0), inMemory(up),
		fleetrate.Config{MaxWait: time.Minute, PermitTTL: 10 * time.Second},
		transport.Options{MaxWait: time.Second, MaxAttempts: 1, Logger: slog.New(logWatch{msgs: msgs})})
	func() {
		req, _ := http.NewRequest(http.MethodGet, "http://llm.test/chat", nil)
		if _, err := tr.RoundTrip(req); err != nil {
			t.Fatal(err)
		}
		// The response is dropped here, its body neither read nor closed.
	}()
	reported := false
	for i := 0; i < 200 && !reported; i++ { // until the collector runs the cleanup
		runtime.GC()
		select {
		case m := <-msgs:
			reported = m == "rate_body_unclosed"
		case <-time.After(10 * time.Millisecond):
		}
	}
	if !reported {
		t.Fatal("no rate_body_unclosed event after 200 collections")
	}
	if got := gauge(t, reg, transport.MetricPermitsHeld); got != 0 {
		t.Errorf("held %v after the report; want 0", got)
	}
	ctx := context.Background()
	bucket := transport.EndpointBucket("llm", "chat")
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	advance(10*time.Second - time.Millisecond)
	r, err := lim.TryAcquire(ctx, bucket)
	if err != nil || r.Result.Allowed {
		t.Fatalf("1 ms before the lease ends: allowed %v, err %v; want the permit still held", r != nil && r.Result.Allowed, err)
	}
	advance(time.Millisecond)
	r, err = lim.TryAcquire(ctx, bucket)
	if err != nil || !r.Result.Allowed {
		t.Fatalf("at the lease's end: allowed %v, err %v; want the permit back", r != nil && r.Result.Allowed, err)
	}
	_ = r.Release(ctx)
}

// rwc is a connection-like body: what a 101 answer carries.
type rwc struct{ io.Reader }

func (rwc) Write(p []byte) (int, error) { return len(p), nil }
func (rwc) Close() error                { return nil }

// TestSwitchingProtocolsBodyStaysWritable: the body of a 101 answer is
// still an io.ReadWriteCloser once the transport holds its permit on it,
// and closing it gives the permit back.
func TestSwitchingProtocolsBodyStaysWritable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusSwitchingProtocols, Header: http.Header{}, Body: rwc{strings.NewReader("")}, Request: r}, nil
		})
		tr, _, reg := boundedSetup(t, memstore.New(memstore.Options{}), llmUpstream(1, 0), base,
			fleetrate.Config{MaxWait: time.Minute}, transport.Options{MaxWait: time.Second, MaxAttempts: 1})
		req, _ := http.NewRequest(http.MethodGet, "http://llm.test/chat", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		conn, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			t.Fatalf("the 101 body is a %T, not an io.ReadWriteCloser", resp.Body)
		}
		if _, err := conn.Write([]byte("ping")); err != nil {
			t.Fatal(err)
		}
		_ = conn.Close()
		if h := gauge(t, reg, transport.MetricPermitsHeld); h != 0 {
			t.Errorf("held %v after close; want 0", h)
		}
	})
}
