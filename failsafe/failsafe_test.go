package failsafe_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) fleetrate.Store {
		s, err := failsafe.New(memstore.New(memstore.Options{}), failsafe.Options{Policy: failsafe.FailClosed})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// flaky is a store whose backend can be switched off, counting the calls
// that reach it. It stands for Redis in the breaker's unit tests; the Redis
// store itself is tested against real redis-server processes.
type flaky struct {
	fleetrate.Store
	down  atomic.Bool
	calls atomic.Int64
}

func (f *flaky) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	f.calls.Add(1)
	if f.down.Load() {
		if err := req.Validate(); err != nil {
			return fleetrate.Result{}, err
		}
		return fleetrate.Result{}, errors.Join(fleetrate.ErrStoreUnavailable, errors.New("connection refused"))
	}
	return f.Store.Take(ctx, req)
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func req(key string, n int64) fleetrate.Request {
	return fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 20)}}}, N: n}
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	primary := &flaky{Store: memstore.New(memstore.Options{})}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	s, err := failsafe.New(primary, failsafe.Options{
		Name: "redis", Policy: failsafe.FailClosed, FailureThreshold: 3, CoolOff: time.Second,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg, Clock: clk.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gauge := func() float64 {
		t.Helper()
		return metric(t, reg, "fleetrate_breaker_open")
	}
	primary.down.Store(true)
	for i := range 3 {
		_, err := s.Take(ctx, req("k", 1))
		if !errors.Is(err, fleetrate.ErrStoreUnavailable) {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if !s.Open() || gauge() != 1 || !strings.Contains(logs.String(), "circuit open") {
		t.Fatalf("after 3 failures: open=%v gauge=%v logs=%q", s.Open(), gauge(), logs.String())
	}
	// While open, calls cost nothing: they never reach the store.
	before := primary.calls.Load()
	for range 100 {
		if _, err := s.Take(ctx, req("k", 1)); !errors.Is(err, failsafe.ErrCircuitOpen) || !errors.Is(err, fleetrate.ErrStoreUnavailable) {
			t.Fatalf("open circuit: %v", err)
		}
	}
	if got := primary.calls.Load() - before; got != 0 {
		t.Fatalf("%d calls reached the store while the circuit was open", got)
	}
	// After the cool-off one probe goes through; it fails, so the breaker
	// opens for another cool-off.
	clk.add(time.Second)
	_, _ = s.Take(ctx, req("k", 1))
	_, _ = s.Take(ctx, req("k", 1))
	if got := primary.calls.Load() - before; got != 1 {
		t.Fatalf("%d probes after the cool-off, want 1", got)
	}
	// The store is back: the next probe succeeds and closes the breaker.
	primary.down.Store(false)
	clk.add(time.Second)
	res, err := s.Take(ctx, req("k", 1))
	if err != nil || !res.Allowed || res.Degraded {
		t.Fatalf("after recovery: %+v %v", res, err)
	}
	if s.Open() || gauge() != 0 || !strings.Contains(logs.String(), "circuit closed") {
		t.Fatalf("after recovery: open=%v gauge=%v logs=%q", s.Open(), gauge(), logs.String())
	}
	failures := metric(t, reg, "fleetrate_store_failures_total")
	if failures != 4 {
		t.Fatalf("failures counter %v, want 4", failures)
	}
}

// metric reads one gauge or counter from reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not registered", name)
	return 0
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := func() *flaky {
		f := &flaky{Store: memstore.New(memstore.Options{})}
		f.down.Store(true)
		return f
	}
	t.Run("fail open allows and marks degraded", func(t *testing.T) {
		t.Parallel()
		s, _ := failsafe.New(down(), failsafe.Options{Policy: failsafe.FailOpen})
		for range 50 {
			res, err := s.Take(ctx, req("k", 1))
			if err != nil || !res.Allowed || !res.Degraded {
				t.Fatalf("%+v %v", res, err)
			}
		}
		if _, err := s.Take(ctx, req("k", 21)); !errors.Is(err, fleetrate.ErrBurstExceeded) {
			t.Fatalf("invalid request under fail open: %v", err)
		}
	})
	t.Run("fail closed is an error, never a denial", func(t *testing.T) {
		t.Parallel()
		s, _ := failsafe.New(down(), failsafe.Options{Policy: failsafe.FailClosed})
		for range 50 {
			res, err := s.Take(ctx, req("k", 1))
			if !errors.Is(err, fleetrate.ErrStoreUnavailable) || res.Allowed {
				t.Fatalf("%+v %v", res, err)
			}
		}
	})
	t.Run("local fallback enforces the shared limit over the fleet size", func(t *testing.T) {
		t.Parallel()
		clk := &clock{t: time.Unix(1_700_000_000, 0)}
		local := memstore.New(memstore.Options{Clock: clk.now})
		s, _ := failsafe.New(down(), failsafe.Options{Policy: failsafe.LocalFallback, FleetSize: 4, Fallback: local})
		allowed := 0
		for range 50 {
			res, err := s.Take(ctx, req("k", 1))
			if err != nil || !res.Degraded {
				t.Fatalf("%+v %v", res, err)
			}
			if res.Allowed {
				allowed++
			}
		}
		if allowed != 5 { // burst 20 / 4
			t.Fatalf("local fallback allowed %d at once, want 5", allowed)
		}
		clk.add(time.Second) // 10/s / 4 = 2.5 tokens
		allowed = 0
		for range 50 {
			if res, _ := s.Take(ctx, req("k", 1)); res.Allowed {
				allowed++
			}
		}
		if allowed != 2 {
			t.Fatalf("after 1s the fallback allowed %d, want 2", allowed)
		}
	})
	t.Run("local fallback through a Limiter divides the rate too", func(t *testing.T) {
		t.Parallel()
		clk := &clock{t: time.Unix(1_700_000_000, 0)}
		local := memstore.New(memstore.Options{Clock: clk.now})
		s, _ := failsafe.New(down(), failsafe.Options{Policy: failsafe.LocalFallback, FleetSize: 10, Fallback: local})
		lim, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 100)}})
		if err != nil {
			t.Fatal(err)
		}
		allowed := 0
		for range 100 {
			clk.add(10 * time.Millisecond) // 1 s in all: 100/s locally, burst 10
			for {
				res, err := lim.Allow(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				if !res.Allowed {
					break
				}
				allowed++
			}
		}
		if allowed > 110 {
			t.Fatalf("local fallback granted %d in 1 s, want at most burst 10 + 100/s", allowed)
		}
	})
	t.Run("bad options", func(t *testing.T) {
		t.Parallel()
		if _, err := failsafe.New(nil, failsafe.Options{}); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Fatal(err)
		}
		if _, err := failsafe.New(down(), failsafe.Options{Policy: 7}); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Fatal(err)
		}
		if _, err := failsafe.ParsePolicy("fail_sideways"); err == nil || !strings.Contains(err.Error(), `"fail_sideways"`) {
			t.Fatal(err)
		}
		if p, err := failsafe.ParsePolicy("local_fallback"); err != nil || p != failsafe.LocalFallback {
			t.Fatal(p, err)
		}
	})
}

func TestCallerCancellationIsNotAStoreFailure(t *testing.T) {
	t.Parallel()
	s, _ := failsafe.New(memstore.New(memstore.Options{}), failsafe.Options{Policy: failsafe.FailOpen, FailureThreshold: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		if res, err := s.Take(ctx, req("k", 1)); err == nil || res.Allowed {
			t.Fatalf("cancelled take: %+v %v", res, err)
		}
	}
	if s.Open() {
		t.Fatal("caller cancellations opened the breaker")
	}
}

// gated is a store whose calls on the key "slow" fail once the gate
// opens, after telling entered they began.
type gated struct {
	fleetrate.Store
	entered chan struct{}
	gate    chan struct{}
}

func (g *gated) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if req.Buckets[0].Key == "slow" {
		g.entered <- struct{}{}
		<-g.gate
		return fleetrate.Result{}, errors.Join(fleetrate.ErrStoreUnavailable, context.DeadlineExceeded)
	}
	return g.Store.Take(ctx, req)
}

// TestFailuresBegunBeforeAnAnswerDoNotOpen: calls that time out while the
// store answers others (a herd starved of CPU after an outage) fail, but
// do not open the breaker: the store is up. Failures begun after its last
// answer still do.
func TestFailuresBegunBeforeAnAnswerDoNotOpen(t *testing.T) {
	t.Parallel()
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	primary := &gated{Store: memstore.New(memstore.Options{}), entered: make(chan struct{}, 16), gate: make(chan struct{})}
	reg := prometheus.NewRegistry()
	s, err := failsafe.New(primary, failsafe.Options{
		Name: "redis", Policy: failsafe.FailClosed, FailureThreshold: 3, CoolOff: time.Second,
		Registerer: reg, Clock: clk.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			_, err := s.Take(ctx, req("slow", 1))
			errs <- err
		})
	}
	for range 8 {
		<-primary.entered
	}
	// The store answers another call while the 8 wait; then they fail.
	clk.add(time.Millisecond)
	if _, err := s.Take(ctx, req("fast", 1)); err != nil {
		t.Fatal(err)
	}
	close(primary.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, fleetrate.ErrStoreUnavailable) {
			t.Fatalf("a slow call returned %v, want its store error", err)
		}
	}
	if s.Open() {
		t.Fatalf("8 failures begun before the store's latest answer opened the breaker")
	}
	if got := metric(t, reg, "fleetrate_store_failures_total"); got != 8 {
		t.Fatalf("failures counter %v, want 8 (counted, though not towards opening)", got)
	}
	// Begun after the last answer, three failures open it as before.
	clk.add(time.Millisecond)
	for range 3 {
		_, _ = s.Take(ctx, req("slow", 1))
	}
	if !s.Open() {
		t.Fatalf("3 failures begun after the store's latest answer did not open the breaker")
	}
}
