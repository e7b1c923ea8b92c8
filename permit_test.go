package fleetrate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// permitLimiter is a limiter whose bucket "api" admits n in flight at a
// rate that never binds, on a memory store timed by synctest's clock.
func permitLimiter(t *testing.T, n int64, maxWait time.Duration) *fleetrate.Limiter {
	t.Helper()
	l, err := fleetrate.New(memstore.New(memstore.Options{Clock: time.Now}), fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: n}},
		MaxWait: maxWait,
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestAcquireBoundsInFlightFirstComeFirstServed: eight callers that each
// hold a permit 100 ms share a bound of 2: never more than 2 hold one, and
// they are served in the order they came.
func TestAcquireBoundsInFlightFirstComeFirstServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := permitLimiter(t, 2, 5*time.Second)
		var held, peak atomic.Int64
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				r, err := l.Acquire(context.Background(), "api")
				if err != nil {
					t.Errorf("caller %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				if h := held.Add(1); h > peak.Load() {
					peak.Store(h)
				}
				time.Sleep(100 * time.Millisecond)
				held.Add(-1)
				if err := r.Release(context.Background()); err != nil {
					t.Error(err)
				}
			})
			time.Sleep(time.Millisecond) // arrive in order
		}
		wg.Wait()
		if p := peak.Load(); p != 2 {
			t.Fatalf("peak in flight %d, want 2", p)
		}
		if st := l.PermitStats(); st != (fleetrate.PermitStats{}) {
			t.Fatalf("PermitStats after every release: %+v, want none held or waiting", st)
		}
		for i, o := range order {
			if o != i {
				t.Fatalf("served in order %v, want first come first served", order)
			}
		}
	})
}

// TestPermitRenewedWhileHeldAndLapsesWhenDead: a holder that lives keeps
// its permit for many leases; one that dies (takes a permit and never
// renews) gives it back when its lease ends, and a waiter gets it then.
func TestPermitRenewedWhileHeldAndLapsesWhenDead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := permitLimiter(t, 1, 30*time.Second)
		r, err := l.Acquire(ctx, "api")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * fleetrate.DefaultPermitTTL)
		if d, err := l.TryAcquire(ctx, "api"); err != nil || d.Result.Allowed {
			t.Fatalf("a permit while its holder lives and renews: %+v, %v, want denied", d, err)
		}
		if r.Lapsed() || !r.Held() {
			t.Fatal("a renewed permit reports lapsed, or not held")
		}
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if r.Held() {
			t.Fatal("a released permit reports held")
		}
		// A dead holder: a permit taken at the store and never renewed.
		b, _ := l.Bucket("api")
		b.InFlight = 1
		dead := fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, Permit: fleetrate.Permit{ID: "dead", TTL: 10 * time.Second}}
		if res, err := l.Store().Take(ctx, dead); err != nil || !res.Allowed {
			t.Fatalf("dead holder's take: %+v, %v", res, err)
		}
		start := time.Now()
		w, err := l.Acquire(ctx, "api")
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited < 10*time.Second || waited > 10*time.Second+time.Millisecond {
			t.Fatalf("the waiter got the dead holder's permit after %v, want when its 10 s lease ended", waited)
		}
		_ = w.Release(ctx)
	})
}

// TestAcquireBackpressureLeavesTheQueue: a wait beyond the bound fails
// with a *BackpressureError and leaves the queue, so that a take after the
// release is granted at once.
func TestAcquireBackpressureLeavesTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := permitLimiter(t, 1, 2*time.Second)
		r, err := l.Acquire(ctx, "api")
		if err != nil {
			t.Fatal(err)
		}
		_, err = l.Acquire(ctx, "api")
		var bp *fleetrate.BackpressureError
		if !errors.As(err, &bp) {
			t.Fatalf("a wait beyond the max wait: %v, want a *BackpressureError", err)
		}
		_ = r.Release(ctx)
		if g, err := l.TryAcquire(ctx, "api"); err != nil || !g.Result.Allowed {
			t.Fatalf("after the waiter gave up and the holder released: %+v, %v, want granted (no ghost in the queue)", g, err)
		}
	})
}

// TestSettleByBucket: a take of 1 request and 600 tokens settled to 200
// tokens gives 400 back; settled again it fails and changes nothing; a
// bucket it did not take from is named.
func TestSettleByBucket(t *testing.T) {
	ctx := context.Background()
	l, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{key}:requests", Limits: []fleetrate.Limit{fleetrate.PerPeriod(100, time.Hour)}},
		{Name: "{key}:tokens", Limits: []fleetrate.Limit{fleetrate.PerPeriod(1000, time.Hour)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.AllowCosts(ctx, fleetrate.Cost{Bucket: "{key}:requests", N: 1}, fleetrate.Cost{Bucket: "{key}:tokens", N: 600})
	if err != nil || !r.Result.Allowed {
		t.Fatalf("AllowCosts: %+v, %v", r, err)
	}
	if err := r.Settle(ctx, fleetrate.Cost{Bucket: "{key}:tokens", N: 200}); err != nil {
		t.Fatal(err)
	}
	peek, _ := l.Peek(ctx, "{key}:tokens")
	if peek.Remaining < 799 {
		t.Fatalf("after settling 600 tokens to 200: %d left, want 799 or 800", peek.Remaining)
	}
	if err := r.Settle(ctx, fleetrate.Cost{Bucket: "{key}:tokens", N: 900}); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "settled already") {
		t.Fatalf("a second settle: %v, want ErrInvalid saying it was settled already", err)
	}
	r2, _ := l.AllowCosts(ctx, fleetrate.Cost{Bucket: "{key}:requests", N: 1})
	if err := r2.Settle(ctx, fleetrate.Cost{Bucket: "{key}:tokens", N: 1}); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), `"{key}:tokens"`) {
		t.Fatalf("settle of a bucket the take did not touch: %v, want ErrInvalid naming it", err)
	}
	if err := r2.Settle(ctx, fleetrate.Cost{Bucket: "{key}:requests", N: 5}); err != nil {
		t.Fatalf("settle to more: %v", err)
	}
	if peek, _ := l.Peek(ctx, "{key}:requests"); peek.Remaining > 94 {
		t.Fatalf("after 1 request and a settle of another to 5: %d left, want at most 94", peek.Remaining)
	}
}

// TestInFlightMisuseNamesTheField: an Allow from a bucket with an
// in-flight bound (it takes no permit) and bad bounds are refused.
func TestInFlightMisuseNamesTheField(t *testing.T) {
	l := permitLimiter(t, 2, time.Second)
	if _, err := l.Allow(context.Background(), "api"); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "permit") {
		t.Fatalf("Allow from a bounded bucket: %v, want ErrInvalid naming the permit", err)
	}
	for _, cfg := range []fleetrate.Config{
		{Buckets: []fleetrate.BucketConfig{{Name: "a", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}, InFlight: -1}}},
		{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}, InFlight: fleetrate.MaxInFlight + 1},
		{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}, PermitTTL: time.Millisecond},
	} {
		if _, err := fleetrate.New(memstore.New(memstore.Options{}), cfg); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "in_flight") && !strings.Contains(err.Error(), "permit ttl") {
			t.Errorf("New(%+v): %v, want ErrInvalid naming in_flight or permit ttl", cfg, err)
		}
	}
}

// TestHeldEndsWithTheLeaseWhenRenewalsFail: a holder whose renewals fail
// (the store is gone) stops reporting its permit held once the lease
// counted from its last successful call ends.
func TestHeldEndsWithTheLeaseWhenRenewalsFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := &flakyStore{Store: memstore.New(memstore.Options{Clock: time.Now})}
		l, err := fleetrate.New(store, fleetrate.Config{
			Buckets:   []fleetrate.BucketConfig{{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}, InFlight: 1}},
			PermitTTL: 3 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		r, err := l.Acquire(context.Background(), "api")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond) // two renewals
		store.down.Store(true)
		if !r.Held() {
			t.Fatal("not held 2.5 s into a 3 s lease renewed at 1 s and 2 s")
		}
		time.Sleep(2600 * time.Millisecond) // the lease from the 2 s renewal ends at 5 s
		if r.Held() {
			t.Fatal("held 5.1 s in, with every renewal since 2 s failed")
		}
		store.down.Store(false)
		time.Sleep(time.Second) // the next renewal finds the lease gone
		if st := l.PermitStats(); !r.Lapsed() || st.Lapsed != 1 || st.Held != 1 {
			t.Fatalf("after a renewal found the lease gone: lapsed %v, %+v; want lapsed, counted, still held until released", r.Lapsed(), st)
		}
	})
}

// flakyStore fails every Renew while down is set.
type flakyStore struct {
	fleetrate.Store
	down atomic.Bool
}

func (f *flakyStore) Renew(ctx context.Context, bs []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	if f.down.Load() {
		return 0, fleetrate.ErrStoreUnavailable
	}
	return f.Store.Renew(ctx, bs, p)
}

// TestReleaseMisuseIsAnError: releasing a denial's reservation, or one
// released already, fails with ErrInvalid and changes nothing; releasing a
// permit whose lease has ended is harmless.
func TestReleaseMisuseIsAnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := permitLimiter(t, 1, time.Second)
		r, err := l.TryAcquire(ctx, "api")
		if err != nil || !r.Result.Allowed {
			t.Fatalf("TryAcquire: %+v, %v", r, err)
		}
		denied, _ := l.TryAcquire(ctx, "api")
		if err := denied.Release(ctx); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "holds no in-flight permit") {
			t.Fatalf("Release of a denial: %v, want ErrInvalid saying it holds no permit", err)
		}
		if err := r.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.Release(ctx); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "released already") {
			t.Fatalf("a second Release: %v, want ErrInvalid saying released already", err)
		}
		if st := l.PermitStats(); st.Held != 0 {
			t.Fatalf("after a release and a refused second one: %+v, want none held", st)
		}
		// A holder whose lease ended (renewals stopped) releases harmlessly.
		g, _ := l.TryAcquire(ctx, "api")
		g.Abandon()
		time.Sleep(fleetrate.DefaultPermitTTL + time.Second)
		if next, _ := l.TryAcquire(ctx, "api"); !next.Result.Allowed {
			t.Fatalf("after an abandoned permit's lease ended: %+v, want granted", next.Result)
		}
	})
}

// wrapped is a store wrapper, as failsafe.Store and the service's
// instrumented store are: it hides the wrapped store's optional
// interfaces and unwraps to it.
type wrapped struct{ fleetrate.Store }

func (w wrapped) Unwrap() fleetrate.Store { return w.Store }

// TestPermitWaiterWakesThroughAWrapper: a Limiter over a wrapped store
// finds the PermitNotifier beneath the wrapper (NotifierOf), so a caller
// waiting for a permit gets it when the holder releases it, not at the
// next retry of its own (a third of the lease, 5 s by default).
func TestPermitWaiterWakesThroughAWrapper(t *testing.T) {
	store := memstore.New(memstore.Options{})
	if n := fleetrate.NotifierOf(wrapped{wrapped{store}}); n == nil {
		t.Fatal("NotifierOf found no notifier beneath two wrappers")
	}
	if n := fleetrate.NotifierOf(wrapped{}); n != nil {
		t.Fatalf("NotifierOf of a wrapper of nothing: %v, want nil", n)
	}
	synctest.Test(t, func(t *testing.T) {
		store := wrapped{memstore.New(memstore.Options{Clock: time.Now})}
		l, err := fleetrate.New(store, fleetrate.Config{
			Buckets: []fleetrate.BucketConfig{{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 1}},
			MaxWait: 10 * time.Second,
		})
		if err != nil {
			t.Fatal(err)
		}
		r, err := l.Acquire(t.Context(), "api")
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time)
		go func() {
			r2, err := l.Acquire(t.Context(), "api")
			if err != nil {
				t.Error(err)
				close(got)
				return
			}
			got <- time.Now()
			_ = r2.Release(t.Context())
		}()
		time.Sleep(100 * time.Millisecond)
		released := time.Now()
		if err := r.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if at, ok := <-got; !ok || at.Sub(released) > 0 {
			t.Fatalf("the waiter got its permit %v after the release, want at once", at.Sub(released))
		}
	})
}
