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

// bulkRun saturates a 10/s bucket (burst 10) with 16 bulk waiters for 10 s
// while one top-class request arrives every second, and returns the top
// class's waits and the tokens bulk got. bulk is the bulk job's context.
func bulkRun(t *testing.T, l *fleetrate.Limiter, bulk context.Context) (top []time.Duration, bulkTokens int64) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	var got atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for time.Now().Before(end) {
				_, err := l.Wait(bulk, "credential")
				var bp *fleetrate.BackpressureError
				switch {
				case err == nil:
					got.Add(1)
				case errors.As(err, &bp):
					time.Sleep(max(bp.RetryAfter, time.Millisecond))
				default:
					t.Error(err)
					return
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // bulk saturates the bucket
	for time.Now().Before(end) {
		start := time.Now()
		if _, err := l.Wait(context.Background(), "credential"); err != nil {
			t.Fatal(err)
		}
		top = append(top, time.Since(start))
		time.Sleep(time.Second - time.Since(start))
	}
	wg.Wait()
	return top, got.Load()
}

// TestPriorityTopClassNeverWaitsBehindBulk runs the same saturating bulk
// job (16 waiters) with and without a class: with a reserve of 3 and a
// horizon of 150 ms, a top-class request waits at most
// Horizon - (Reserve-1)*T = 0; without, it waits behind the bulk waiters'
// bookings.
func TestPriorityTopClassNeverWaitsBehindBulk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bulkClass := fleetrate.Priority{Name: "bulk", Reserve: 3, Horizon: 150 * time.Millisecond}
		cfg := fleetrate.Config{
			Buckets: []fleetrate.BucketConfig{{Name: "credential", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}}},
			MaxWait: 2 * time.Second,
		}
		plain := newLimiter(t, cfg)
		cfg.Priorities = []fleetrate.Priority{bulkClass}
		prio := newLimiter(t, cfg)

		topPlain, _ := bulkRun(t, plain, context.Background())
		topPrio, bulk := bulkRun(t, prio, fleetrate.WithPriority(context.Background(), "bulk"))
		for i, w := range topPrio {
			if w != 0 {
				t.Fatalf("with priorities, top request %d waited %v, want 0 (bound max(0, 150ms - 2*100ms))", i, w)
			}
		}
		slowest := time.Duration(0)
		for _, w := range topPlain {
			slowest = max(slowest, w)
		}
		if slowest < time.Second {
			t.Fatalf("without priorities the top requests waited at most %v: the bulk job did not saturate the bucket", slowest)
		}
		// Bulk uses everything the top class leaves: 10 s at 10/s plus the
		// burst, less the top class's tokens and the reserve it leaves
		// unused at the end, give or take the tokens of one horizon.
		want := int64(10*10+10) - int64(len(topPrio)) - bulkClass.Reserve
		if bulk < want-2 || bulk > want {
			t.Fatalf("bulk got %d tokens, want about %d", bulk, want)
		}
	})
}

func TestPriorityAllowKeepsReserve(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, fleetrate.Config{
		Limits:     []fleetrate.Limit{fleetrate.Every(time.Hour, 5)},
		Priorities: []fleetrate.Priority{{Name: "bulk", Reserve: 2}},
	})
	bulk := fleetrate.WithPriority(t.Context(), "bulk")
	for i := range 4 {
		res, err := l.Allow(bulk, "k")
		if err != nil || res.Allowed != (i < 3) {
			t.Fatalf("bulk allow %d: %+v %v, want allowed only for the first 3", i, res, err)
		}
	}
	if res, err := l.Peek(bulk, "k"); err != nil || !res.Allowed || res.Remaining != 2 {
		t.Fatalf("bulk peek: %+v %v, want the reserve of 2 intact", res, err)
	}
	for i := range 2 {
		if res, err := l.Allow(t.Context(), "k"); err != nil || !res.Allowed {
			t.Fatalf("top allow %d: %+v %v, want allowed from the reserve", i, res, err)
		}
	}
	if _, err := l.AllowN(bulk, 4, "k"); !errors.Is(err, fleetrate.ErrBurstExceeded) {
		t.Fatalf("bulk AllowN(4) with reserve 2 of burst 5: %v, want ErrBurstExceeded", err)
	}
	if _, err := l.Allow(fleetrate.WithPriority(t.Context(), "blk"), "k"); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), `"blk"`) {
		t.Fatalf("an unknown class: %v, want ErrInvalid naming it", err)
	}
}

func TestPriorityHorizonIsTheMaxWait(t *testing.T) {
	t.Parallel()
	l := newLimiter(t, fleetrate.Config{
		Limits:     []fleetrate.Limit{fleetrate.Every(time.Minute, 3)},
		Priorities: []fleetrate.Priority{{Name: "bulk", Reserve: 1, Horizon: 90 * time.Second}},
		MaxWait:    time.Hour,
	})
	bulk := fleetrate.WithPriority(t.Context(), "bulk")
	if _, err := l.ReserveN(bulk, 2, "k"); err != nil {
		t.Fatal(err)
	}
	r, err := l.Reserve(bulk, "k")
	if err != nil || r.Result.Wait <= 0 || r.Result.Wait > 90*time.Second {
		t.Fatalf("bulk reserve beyond the reserve: %+v %v, want booked within the horizon", r, err)
	}
	_, err = l.Reserve(bulk, "k")
	var bp *fleetrate.BackpressureError
	if !errors.As(err, &bp) || bp.MaxWait != 90*time.Second {
		t.Fatalf("bulk reserve beyond the horizon: %v, want backpressure at max wait 90s", err)
	}
}

// TestPriorityPerBucket: a class keeps its reserve on the buckets that
// configure it; the endpoint bucket of the same take, which does not, is
// taken from as by the top class.
func TestPriorityPerBucket(t *testing.T) {
	t.Parallel()
	lim := []fleetrate.Limit{fleetrate.Every(time.Hour, 4)}
	l := newLimiter(t, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{cred}", Limits: lim, Priorities: []fleetrate.Priority{{Name: "bulk", Reserve: 2}}},
		{Name: "{cred}/availability", Limits: lim},
	}})
	bulk := fleetrate.WithPriority(t.Context(), "bulk")
	for i := range 3 {
		res, err := l.AllowN(bulk, 1, "{cred}/availability", "{cred}")
		if err != nil || res.Allowed != (i < 2) {
			t.Fatalf("bulk take %d: %+v %v", i, res, err)
		}
	}
	if res, err := l.AllowN(bulk, 2, "{cred}/availability"); err != nil || !res.Allowed {
		t.Fatalf("bulk on the endpoint alone: %+v %v, want its last 2 tokens (no reserve there)", res, err)
	}
}

func TestPriorityConfigErrors(t *testing.T) {
	t.Parallel()
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 5)}
	for _, c := range []struct {
		name string
		cfg  fleetrate.Config
		want string
	}{
		{"empty name", fleetrate.Config{Limits: lim, Priorities: []fleetrate.Priority{{Reserve: 1}}}, "priorities[0].name"},
		{"duplicate", fleetrate.Config{Limits: lim, Priorities: []fleetrate.Priority{{Name: "a"}, {Name: "a"}}}, `duplicate "a"`},
		{"negative reserve", fleetrate.Config{Limits: lim, Priorities: []fleetrate.Priority{{Name: "a", Reserve: -1}}}, `"a" reserve`},
		{"reserve of the burst", fleetrate.Config{Limits: lim, Priorities: []fleetrate.Priority{{Name: "a", Reserve: 5}}}, "below the burst"},
		{"horizon", fleetrate.Config{Limits: lim, Priorities: []fleetrate.Priority{{Name: "a", Horizon: -1}}}, `"a" horizon`},
		{"inherited by a small bucket", fleetrate.Config{
			Priorities: []fleetrate.Priority{{Name: "a", Reserve: 3}},
			Buckets:    []fleetrate.BucketConfig{{Name: "small", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}}},
		}, `buckets[0] "small"`},
		{"bucket's own", fleetrate.Config{
			Buckets: []fleetrate.BucketConfig{{Name: "b", Limits: lim, Priorities: []fleetrate.Priority{{Name: "a", Reserve: 9}}}},
		}, `buckets[0] "b" priorities[0]`},
	} {
		err := c.cfg.Validate()
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalid naming %q", c.name, err, c.want)
		}
	}
}

// TestPriorityOnALimiterWithoutClasses: a class named on a limiter that
// configures none is an error, on the fast paths too, as on one that
// configures others.
func TestPriorityOnALimiterWithoutClasses(t *testing.T) {
	l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}})
	ctx := fleetrate.WithPriority(context.Background(), "nope")
	calls := map[string]func() error{
		"Allow": func() error { _, err := l.Allow(ctx, "k"); return err },
		"Peek":  func() error { _, err := l.Peek(ctx, "k"); return err },
		"Wait":  func() error { _, err := l.Wait(ctx, "k"); return err },
		"Reserve": func() error {
			_, err := l.Reserve(ctx, "k")
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("%s with an unknown class: %v, want ErrInvalid naming it", name, err)
		}
	}
	if _, err := l.Allow(fleetrate.WithPriority(context.Background(), ""), "k"); err != nil {
		t.Errorf("Allow as top class: %v", err)
	}
}

// TestQueuedLowerClassNeverHoldsBackTheTop: a bulk Acquire waiting in the
// permit queue is passed by a top-class Acquire, and is granted only when
// a permit is free beyond its class's reserve.
func TestQueuedLowerClassNeverHoldsBackTheTop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{MaxWait: time.Minute, Buckets: []fleetrate.BucketConfig{{
			Name: "llm", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 2,
			Priorities: []fleetrate.Priority{{Name: "bulk", InFlightReserve: 1, Horizon: time.Minute}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		bulk := fleetrate.WithPriority(ctx, "bulk")
		first, err := lim.Acquire(bulk, "llm")
		if err != nil {
			t.Fatal(err)
		}
		waiter := make(chan time.Time, 1)
		go func() {
			r, err := lim.Acquire(bulk, "llm")
			if err != nil {
				t.Errorf("the queued bulk Acquire: %v", err)
				return
			}
			waiter <- time.Now()
			_ = r.Release(ctx)
		}()
		synctest.Wait() // the bulk waiter is queued
		top, err := lim.Acquire(ctx, "llm")
		if err != nil {
			t.Fatalf("a top Acquire behind a queued bulk one: %v", err)
		}
		time.Sleep(time.Second)
		_ = first.Release(ctx) // 1 of 2 held (top): still none beyond the reserve
		synctest.Wait()
		select {
		case <-waiter:
			t.Fatal("the bulk waiter took the permit the top class keeps")
		default:
		}
		time.Sleep(time.Second)
		released := time.Now()
		_ = top.Release(ctx)
		if at := <-waiter; at.Sub(released) > time.Millisecond {
			t.Errorf("the bulk waiter was granted %v after the last permit freed, want at once", at.Sub(released))
		}
	})
}

// TestPriorityKeepsPermits: a class with an in-flight reserve leaves that
// many permits of the bound to the classes above; a reserve of the whole
// bound is refused, naming the field.
func TestPriorityKeepsPermits(t *testing.T) {
	ctx := context.Background()
	lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: []fleetrate.BucketConfig{{
		Name: "llm", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 2,
		Priorities: []fleetrate.Priority{{Name: "bulk", InFlightReserve: 1}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	bulk := fleetrate.WithPriority(ctx, "bulk")
	first, err := lim.TryAcquire(bulk, "llm")
	if err != nil || !first.Result.Allowed {
		t.Fatalf("the first bulk acquire: %+v, %v; want granted", first, err)
	}
	if r, err := lim.TryAcquire(bulk, "llm"); err != nil || r.Result.Allowed {
		t.Fatalf("a second bulk acquire, 1 of 2 held and 1 kept: %+v, %v; want refused", r, err)
	}
	top, err := lim.TryAcquire(ctx, "llm")
	if err != nil || !top.Result.Allowed {
		t.Fatalf("a top acquire with the kept permit free: %+v, %v; want granted", top, err)
	}
	_ = first.Release(ctx)
	_ = top.Release(ctx)
	_, err = fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: []fleetrate.BucketConfig{{
		Name: "llm", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 2,
		Priorities: []fleetrate.Priority{{Name: "bulk", InFlightReserve: 2}},
	}}})
	if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "in_flight_reserve") {
		t.Fatalf("an in-flight reserve of the whole bound: %v, want ErrInvalid naming in_flight_reserve", err)
	}
}
