package fleetrate_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

func newLimiter(t *testing.T, cfg fleetrate.Config) *fleetrate.Limiter {
	t.Helper()
	l, err := fleetrate.New(memstore.New(memstore.Options{}), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestWaitSleepsExactlyTheBookedDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}})
		start := time.Now()
		for range 4 {
			if _, err := l.Wait(t.Context(), "k"); err != nil {
				t.Fatal(err)
			}
		}
		if got := time.Since(start); got != 300*time.Millisecond {
			t.Fatalf("4 waits at 10/s burst 1 took %v, want exactly 300ms", got)
		}
	})
}

func TestWaitServesWaitersInBookingOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 1)}})
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := range 20 {
			wg.Go(func() {
				if _, err := l.Wait(t.Context(), "k"); err != nil {
					t.Error(err)
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
			})
			synctest.Wait() // waiter i has booked before waiter i+1 starts
		}
		wg.Wait()
		for i, got := range order {
			if got != i {
				t.Fatalf("completion order %v, want booking order", order)
			}
		}
	})
}

func TestWaitCancelledRefundsTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
		if res, err := l.Allow(t.Context(), "k"); err != nil || !res.Allowed {
			t.Fatal(res, err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { _, err := l.Wait(ctx, "k"); done <- err }()
		time.Sleep(100 * time.Millisecond)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
		res, err := l.Peek(t.Context(), "k")
		if err != nil {
			t.Fatal(err)
		}
		// Without the refund the bucket would owe a second token.
		if !res.Allowed || res.ResetAfter != 900*time.Millisecond {
			t.Fatalf("after cancel: %+v, want the booked token refunded", res)
		}
	})
}

func TestWaitFailsAtOnceWhenDeadlineIsTooSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
		_, _ = l.Allow(t.Context(), "k")
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := l.Wait(ctx, "k")
		var bp *fleetrate.BackpressureError
		if !errors.As(err, &bp) || !errors.Is(err, fleetrate.ErrBackpressure) {
			t.Fatalf("Wait = %v, want a BackpressureError", err)
		}
		if bp.RetryAfter != time.Second || bp.MaxWait != 500*time.Millisecond {
			t.Fatalf("BackpressureError %+v", bp)
		}
		if time.Since(start) != 0 {
			t.Fatalf("Wait slept %v before failing", time.Since(start))
		}
		// Nothing was booked.
		if res, _ := l.Peek(t.Context(), "k"); res.ResetAfter != time.Second {
			t.Fatalf("after backpressure: %+v", res)
		}
	})
}

func TestReserveBeyondMaxWaitIsBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}, MaxWait: 2 * time.Second})
		ctx := t.Context()
		for i, want := range []time.Duration{0, 0, time.Second, 2 * time.Second} {
			r, err := l.Reserve(ctx, "k")
			if err != nil || r.Delay() != want {
				t.Fatalf("reservation %d: %v, %v; want delay %v", i, r, err, want)
			}
		}
		_, err := l.Reserve(ctx, "k")
		var bp *fleetrate.BackpressureError
		if !errors.As(err, &bp) || bp.RetryAfter != 3*time.Second {
			t.Fatalf("fifth reservation: %v, want backpressure with retry-after 3s", err)
		}
		if _, err := l.ReserveN(ctx, 3, "k"); !errors.Is(err, fleetrate.ErrBurstExceeded) {
			t.Fatalf("n > burst: %v", err)
		}
	})
}

func TestReservationCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
		ctx := t.Context()
		r1, _ := l.Reserve(ctx, "k")
		r2, err := l.Reserve(ctx, "k")
		if err != nil || r2.Delay() != time.Second {
			t.Fatal(r2, err)
		}
		if err := r2.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r1.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		if res, _ := l.Peek(ctx, "k"); res.Remaining != 1 {
			t.Fatalf("after cancelling both: %+v, want full", res)
		}
	})
}

func TestDrainPausesThenRefillsFromEmpty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
			{Name: "{ota}/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 5)}},
		}})
		ctx := t.Context()
		if err := l.DrainUntil(ctx, time.Now().Add(2*time.Second), "{ota}/availability"); err != nil {
			t.Fatal(err)
		}
		res, _ := l.Allow(ctx, "{ota}/availability")
		if res.Allowed || res.RetryAfter != 2100*time.Millisecond {
			t.Fatalf("during drain: %+v", res)
		}
		time.Sleep(2 * time.Second)
		// The drain is over but the bucket refills from empty: no burst.
		if res, _ := l.Allow(ctx, "{ota}/availability"); res.Allowed {
			t.Fatalf("right after drain: %+v, want still empty", res)
		}
		time.Sleep(500 * time.Millisecond)
		if res, _ := l.AllowN(ctx, 5, "{ota}/availability"); !res.Allowed {
			t.Fatalf("500ms after drain: %+v, want 5 tokens", res)
		}
		if _, err := l.Allow(ctx, "unknown"); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), `"unknown"`) {
			t.Fatalf("unknown bucket: %v", err)
		}
	})
}

func TestConfigValidateNamesFieldAndValue(t *testing.T) {
	t.Parallel()
	ok := []fleetrate.Limit{fleetrate.PerSecond(1, 1)}
	cases := []struct {
		name string
		cfg  fleetrate.Config
		want string
	}{
		{"nothing", fleetrate.Config{}, "limits or buckets must be set"},
		{"nan rate", fleetrate.Config{Limits: []fleetrate.Limit{{Rate: math.NaN(), Burst: 1}}}, "limits[0]: rate must be positive and finite, got NaN"},
		{"negative rate", fleetrate.Config{Limits: []fleetrate.Limit{{Rate: -3, Burst: 1}}}, "got -3"},
		{"inf rate", fleetrate.Config{Limits: []fleetrate.Limit{{Rate: math.Inf(1), Burst: 1}}}, "got +Inf"},
		{"zero burst", fleetrate.Config{Limits: []fleetrate.Limit{{Rate: 1, Burst: 0}}}, "limits[0]: burst must be at least 1, got 0"},
		{"empty name", fleetrate.Config{Buckets: []fleetrate.BucketConfig{{Name: "", Limits: ok}}}, "buckets[0].name: name must not be empty"},
		{"duplicate", fleetrate.Config{Buckets: []fleetrate.BucketConfig{{Name: "a", Limits: ok}, {Name: "a", Limits: ok}}}, `buckets[1].name: duplicate "a"`},
		{"bucket limit", fleetrate.Config{Buckets: []fleetrate.BucketConfig{{Name: "a", Limits: []fleetrate.Limit{{Rate: 0, Burst: 1}}}}}, `buckets[0] "a" limits[0]: rate`},
		{"no limits", fleetrate.Config{Buckets: []fleetrate.BucketConfig{{Name: "a"}}}, "at least one limit"},
		{"max wait", fleetrate.Config{Limits: ok, MaxWait: -time.Second}, "max wait must be between"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := fleetrate.New(memstore.New(memstore.Options{}), c.cfg)
			if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New = %v, want ErrInvalid containing %q", err, c.want)
			}
		})
	}
	if _, err := fleetrate.New(nil, fleetrate.Config{Limits: ok}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("nil store: %v", err)
	}
	l := newLimiter(t, fleetrate.Config{Limits: ok})
	if _, err := l.Allow(context.Background(), strings.Repeat("x", fleetrate.MaxNameLen+1)); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("long name: %v", err)
	}
	if _, err := l.AllowN(context.Background(), 1); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("no names: %v", err)
	}
}

// failingStore fails every call, as a store that lost its backend does.
type failingStore struct{}

var errDown = errors.New("connection refused")

func (failingStore) Take(context.Context, fleetrate.Request) (fleetrate.Result, error) {
	return fleetrate.Result{}, errors.Join(fleetrate.ErrStoreUnavailable, errDown)
}
func (failingStore) Refund(context.Context, []fleetrate.Bucket, int64, time.Time) error {
	return errDown
}
func (failingStore) Cancel(context.Context, []fleetrate.Bucket, int64, fleetrate.Booking) error {
	return errDown
}
func (failingStore) Drain(context.Context, []fleetrate.Bucket, time.Duration) error {
	return errDown
}
func (failingStore) Reset(context.Context, ...string) error             { return errDown }
func (failingStore) DrainEach(context.Context, []fleetrate.Drain) error { return errDown }
func (failingStore) Settle(context.Context, []fleetrate.Bucket, fleetrate.Settlement) error {
	return errDown
}
func (failingStore) Release(context.Context, []fleetrate.Bucket, string) (int, error) {
	return 0, errDown
}
func (failingStore) Renew(context.Context, []fleetrate.Bucket, fleetrate.Permit) (int, error) {
	return 0, errDown
}

func TestStoreFailureIsAnErrorNotADenial(t *testing.T) {
	t.Parallel()
	l, err := fleetrate.New(failingStore{}, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(context.Background(), "k"); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Fatalf("Allow = %v", err)
	}
	if _, err := l.Wait(context.Background(), "k"); !errors.Is(err, fleetrate.ErrStoreUnavailable) || errors.Is(err, fleetrate.ErrBackpressure) {
		t.Fatalf("Wait = %v", err)
	}
}

// TestAllowThroughBoundTakers checks the Binder path of Allow and Peek: the
// default and the named limits apply, results carry the limits as
// configured, and invalid names still fail.
func TestAllowThroughBoundTakers(t *testing.T) {
	t.Parallel()
	def := fleetrate.Every(time.Hour, 2).Named("default")
	own := fleetrate.Every(time.Hour, 1).Named("own")
	l := newLimiter(t, fleetrate.Config{
		Limits:  []fleetrate.Limit{def},
		Buckets: []fleetrate.BucketConfig{{Name: "named", Limits: []fleetrate.Limit{own}}},
	})
	ctx := context.Background()
	for i, want := range []bool{true, true, false} {
		res, err := l.Allow(ctx, "k")
		if err != nil || res.Allowed != want || res.Limit != def {
			t.Fatalf("take %d of k: %+v, %v; want allowed %v by %+v", i, res, err, want, def)
		}
	}
	if res, err := l.Peek(ctx, "k"); err != nil || !res.Allowed || res.Remaining != 0 || res.Limit != def {
		t.Fatalf("peek of k: %+v, %v", res, err)
	}
	for i, want := range []bool{true, false} {
		res, err := l.Allow(ctx, "named")
		if err != nil || res.Allowed != want || res.Limit != own {
			t.Fatalf("take %d of named: %+v, %v; want allowed %v by %+v", i, res, err, want, own)
		}
	}
	for _, name := range []string{"", strings.Repeat("x", fleetrate.MaxNameLen+1)} {
		if _, err := l.Allow(ctx, name); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Errorf("Allow(%d-byte name): %v, want ErrInvalid", len(name), err)
		}
	}
	only := newLimiter(t, fleetrate.Config{Buckets: []fleetrate.BucketConfig{{Name: "named", Limits: []fleetrate.Limit{own}}}})
	if _, err := only.Allow(ctx, "other"); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("Allow of an unknown bucket without default limits: %v", err)
	}
	if res, err := only.AllowN(ctx, 2, "named"); !errors.Is(err, fleetrate.ErrBurstExceeded) || res.Allowed {
		t.Errorf("AllowN beyond the burst: %+v, %v", res, err)
	}
}

// slowReplies is a store whose answers reach the caller late, as when a
// burst of replies waits for a busy scheduler.
type slowReplies struct {
	fleetrate.Store
	delay time.Duration
}

func (s *slowReplies) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	res, err := s.Store.Take(ctx, req)
	time.Sleep(s.delay)
	return res, err
}

// TestWaitTimesTheSlotFromTheDecision: once a prompt round trip has
// anchored the store's clock, a waiter whose reply arrives 5 ms late still
// wakes at its booked slot, not 5 ms after it; and no waiter ever wakes
// before its slot.
func TestWaitTimesTheSlotFromTheDecision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &slowReplies{Store: memstore.New(memstore.Options{})}
		l, err := fleetrate.New(st, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		if _, err := l.WaitN(ctx, 1, "k"); err != nil { // prompt: anchors
			t.Fatal(err)
		}
		st.delay = 5 * time.Millisecond
		res, err := l.WaitN(ctx, 1, "k")
		if err != nil {
			t.Fatal(err)
		}
		slot := res.At.Add(res.Wait)
		if res.Wait != 10*time.Millisecond {
			t.Fatalf("booked wait %v, want 10ms", res.Wait)
		}
		if woke := time.Now(); woke.Before(slot) || woke.Sub(slot) > 10*time.Microsecond {
			t.Fatalf("woke %v after the slot, want within 10µs (the reply was 5ms late)", woke.Sub(slot))
		}
		// A reservation is timed the same way.
		r, err := l.ReserveN(ctx, 1, "k")
		if err != nil {
			t.Fatal(err)
		}
		if due := time.Now().Add(r.Delay()); due.Before(r.Result.At.Add(r.Result.Wait)) || due.Sub(r.Result.At.Add(r.Result.Wait)) > 10*time.Microsecond {
			t.Fatalf("reservation due %v after its slot", due.Sub(r.Result.At.Add(r.Result.Wait)))
		}
	})
}

// severalClocks is slowReplies for a store that reports several clocks.
type severalClocks struct{ slowReplies }

func (*severalClocks) MultipleClocks() bool { return true }

// TestWaitCountsFromTheAnswerWithSeveralClocks: a store with several
// clocks is never anchored, so a late reply delays the wake-up by its
// lateness (never early).
func TestWaitCountsFromTheAnswerWithSeveralClocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := &severalClocks{slowReplies{Store: memstore.New(memstore.Options{})}}
		l, err := fleetrate.New(st, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 1)}})
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		if _, err := l.WaitN(ctx, 1, "k"); err != nil {
			t.Fatal(err)
		}
		st.delay = 5 * time.Millisecond
		res, err := l.WaitN(ctx, 1, "k")
		if err != nil {
			t.Fatal(err)
		}
		if late := time.Since(res.At.Add(res.Wait)); late != 5*time.Millisecond {
			t.Fatalf("woke %v after the slot, want the reply's 5ms", late)
		}
	})
}

// TestNilContextIsAnError: every call given a nil context returns an
// error wrapping ErrInvalid instead of panicking in the store.
func TestNilContextIsAnError(t *testing.T) {
	l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}})
	var nilCtx context.Context
	calls := map[string]func() error{
		"Allow":   func() error { _, err := l.Allow(nilCtx, "k"); return err },
		"AllowN":  func() error { _, err := l.AllowN(nilCtx, 1, "k"); return err },
		"Peek":    func() error { _, err := l.Peek(nilCtx, "k"); return err },
		"Reserve": func() error { _, err := l.Reserve(nilCtx, "k"); return err },
		"Wait":    func() error { _, err := l.Wait(nilCtx, "k"); return err },
		"Refund":  func() error { return l.Refund(nilCtx, fleetrate.Result{Allowed: true, N: 1, At: time.Now()}, "k") },
		"Drain":   func() error { return l.Drain(nilCtx, time.Second, "k") },
		"Reset":   func() error { return l.Reset(nilCtx, "k") },
		"Book": func() error {
			b, _ := l.Bucket("k")
			_, err := l.Book(nilCtx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
			return err
		},
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "ctx is nil") {
			t.Errorf("%s(nil): %v, want ErrInvalid naming ctx", name, err)
		}
	}
}
