package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/memstore"
)

// counting is a store that counts the takes and the give-backs (refunds
// and cancels) reaching it and can fail on demand.
type counting struct {
	fleetrate.Store
	takes   atomic.Int64
	reqs    chan fleetrate.Request // every take's request, when not nil
	refunds chan int64             // every refund's or cancel's n, when not nil
	fail    atomic.Bool
}

func (c *counting) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	c.takes.Add(1)
	if c.reqs != nil {
		c.reqs <- req
	}
	if c.fail.Load() {
		return fleetrate.Result{}, fmt.Errorf("%w: boom", fleetrate.ErrStoreUnavailable)
	}
	return c.Store.Take(ctx, req)
}

func (c *counting) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	err := c.Store.Refund(ctx, buckets, n, at)
	if c.refunds != nil {
		c.refunds <- n
	}
	return err
}

func (c *counting) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	err := c.Store.Cancel(ctx, buckets, n, b)
	if c.refunds != nil {
		c.refunds <- n
	}
	return err
}

func setup(t *testing.T, o lease.Options) (*lease.Store, *counting, *manualclock.Clock) {
	t.Helper()
	clock := manualclock.New(time.Unix(1_700_000_000, 0))
	inner := &counting{Store: memstore.New(memstore.Options{Clock: clock.Now})}
	o.Clock = clock.Now
	s, err := lease.New(inner, o)
	if err != nil {
		t.Fatal(err)
	}
	return s, inner, clock
}

func take(t *testing.T, s fleetrate.Store, b fleetrate.Bucket, n int64) fleetrate.Result {
	t.Helper()
	res, err := s.Take(context.Background(), fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: n})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestNewChecksOptions(t *testing.T) {
	inner := memstore.New(memstore.Options{})
	for _, c := range []struct {
		inner fleetrate.Store
		o     lease.Options
		want  string
	}{
		{nil, lease.Options{Tokens: 4}, "inner store"},
		{inner, lease.Options{}, "tokens must be at least 2, got 0"},
		{inner, lease.Options{Tokens: 1}, "tokens must be at least 2, got 1"},
		{inner, lease.Options{Tokens: 4, MaxAge: -time.Second}, "max age must not be negative"},
		{inner, lease.Options{Tokens: 4, MaxKeys: -1}, "max keys must not be negative"},
	} {
		_, err := lease.New(c.inner, c.o)
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want ErrInvalid naming %q", c.o, err, c.want)
		}
	}
}

// TestLeaseServesTakesLocally: one store call leases Tokens tokens, the
// takes after it are served from the lease, and the bucket has given
// exactly the tokens leased.
func TestLeaseServesTakesLocally(t *testing.T) {
	s, inner, _ := setup(t, lease.Options{Tokens: 5, MaxAge: time.Second})
	b := fleetrate.Bucket{Key: "hot", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 100)}}
	for i := range 12 {
		res := take(t, s, b, 1)
		if !res.Allowed || res.N != 1 {
			t.Fatalf("take %d: %+v", i, res)
		}
		// The first take of each lease reports the bucket's tokens plus
		// the lease's; the others, what the lease holds.
		want := int64(4 - i%5)
		if i%5 == 0 {
			want = 100 - int64(i/5+1)*5 + 4
		}
		if res.Remaining != want {
			t.Fatalf("take %d: remaining %d, want %d", i, res.Remaining, want)
		}
	}
	if n := inner.takes.Load(); n != 3 {
		t.Fatalf("%d store takes for 12 grants, want 3 (leases of 5)", n)
	}
	peek := take(t, inner.Store, b, 0)
	if peek.Remaining != 85 {
		t.Fatalf("the bucket holds %d tokens, want 100 - 3 leases of 5", peek.Remaining)
	}
}

// TestLeasedTakesAreAtTheLease: a take served from a lease reports the
// lease's time, on the store's clock, not the process's: a settle names
// the take in the store by it (fleetrate.Settlement.At).
func TestLeasedTakesAreAtTheLease(t *testing.T) {
	s, _, clock := setup(t, lease.Options{Tokens: 5, MaxAge: time.Second})
	b := fleetrate.Bucket{Key: "hot", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 100)}}
	first := take(t, s, b, 1)
	clock.Advance(300 * time.Millisecond)
	if res := take(t, s, b, 1); !res.Allowed || !res.At.Equal(first.At) {
		t.Fatalf("a leased take 300 ms after its lease: %+v, want allowed at the lease's %v", res, first.At)
	}
}

// TestExpiredLeaseGivesTokensBack: the tokens left in a lease older than
// MaxAge are not spent; the next take returns them to the bucket and
// leases anew.
func TestExpiredLeaseGivesTokensBack(t *testing.T) {
	s, inner, clock := setup(t, lease.Options{Tokens: 5, MaxAge: 100 * time.Millisecond})
	inner.refunds = make(chan int64, 1)
	b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 10)}}
	take(t, s, b, 1)
	take(t, s, b, 1) // 3 left
	clock.Advance(100 * time.Millisecond)
	// 3 go back (the bucket holds 8), a new lease takes 5 and this take 2.
	if res := take(t, s, b, 2); !res.Allowed || res.Remaining != 3+3 {
		t.Fatalf("take after expiry: %+v, want a new lease", res)
	}
	if n := <-inner.refunds; n != 3 {
		t.Fatalf("refunded %d, want the 3 left in the expired lease", n)
	}
	if peek := take(t, inner.Store, b, 0); peek.Remaining != 10-5+3-5 {
		t.Fatalf("the bucket holds %d tokens, want 3 (two leases of 5, 3 given back)", peek.Remaining)
	}
}

// TestRefusedLeaseTakesOneByOne: when the bucket holds fewer tokens than a
// lease, takes go to the store one by one, with its exact decisions and no
// further lease tries, until one finds enough tokens for a lease.
func TestRefusedLeaseTakesOneByOne(t *testing.T) {
	s, inner, clock := setup(t, lease.Options{Tokens: 4, MaxAge: time.Minute})
	b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 6)}}
	for range 4 {
		take(t, s, b, 1) // one lease
	}
	inner.takes.Store(0)
	// 2 tokens left: the lease is refused, the take goes alone.
	if res := take(t, s, b, 1); !res.Allowed || res.Remaining != 1 {
		t.Fatalf("take with 2 tokens left: %+v", res)
	}
	if n := inner.takes.Load(); n != 2 {
		t.Fatalf("%d store takes, want a refused lease and a single take", n)
	}
	if res := take(t, s, b, 1); !res.Allowed || res.Remaining != 0 {
		t.Fatalf("last token: %+v", res)
	}
	res := take(t, s, b, 1)
	if res.Allowed || res.RetryAfter != time.Second {
		t.Fatalf("take of an empty bucket: %+v, want a denial with retry after 1s", res)
	}
	if n := inner.takes.Load(); n != 4 {
		t.Fatalf("%d store takes, want one per take while the bucket is low", n)
	}
	// 5 s later the bucket holds 5: a take alone finds 4 left, and the
	// next leases again.
	clock.Advance(5 * time.Second)
	inner.takes.Store(0)
	for i := range 5 {
		if res := take(t, s, b, 1); !res.Allowed {
			t.Fatalf("take %d after 5 s: %+v", i, res)
		}
	}
	if n := inner.takes.Load(); n != 2 {
		t.Fatalf("%d store takes for 5 grants once the bucket refilled, want a take alone and a lease", n)
	}
}

// TestOtherTakesPassThrough: waits, peeks, takes of several buckets and
// takes larger than a lease reach the store unchanged.
func TestOtherTakesPassThrough(t *testing.T) {
	s, inner, _ := setup(t, lease.Options{Tokens: 4})
	inner.reqs = make(chan fleetrate.Request, 1)
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 20)}
	a, b := fleetrate.Bucket{Key: "a", Limits: lim}, fleetrate.Bucket{Key: "b", Limits: lim}
	for _, req := range []fleetrate.Request{
		{Buckets: []fleetrate.Bucket{a}, N: 1, MaxWait: time.Second},
		{Buckets: []fleetrate.Bucket{a}, N: 0},
		{Buckets: []fleetrate.Bucket{a, b}, N: 1},
		{Buckets: []fleetrate.Bucket{a}, N: 5},
	} {
		if _, err := s.Take(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		if got := <-inner.reqs; got.N != req.N || got.MaxWait != req.MaxWait || len(got.Buckets) != len(req.Buckets) {
			t.Fatalf("%+v reached the store as %+v", req, got)
		}
	}
}

// TestErrorsAreErrors: a failing store is an error, never a denial, and an
// invalid request is ErrInvalid even when a lease could serve it.
func TestErrorsAreErrors(t *testing.T) {
	s, inner, _ := setup(t, lease.Options{Tokens: 4})
	b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 20)}}
	inner.fail.Store(true)
	if _, err := s.Take(context.Background(), fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1}); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Fatalf("take on a failing store: %v", err)
	}
	inner.fail.Store(false)
	take(t, s, b, 1) // a lease
	bad := fleetrate.Bucket{Key: "", Limits: b.Limits}
	if _, err := s.Take(context.Background(), fleetrate.Request{Buckets: []fleetrate.Bucket{bad}, N: 1}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("take of a bucket without a key: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1}); err == nil {
		// A lease may serve it: the take never reaches the store. Either
		// way it must not be a denial.
		t.Log("served from the lease despite the cancelled context")
	}
}

// TestWindowBound runs P lease stores (P processes) on one bucket, at
// about 60 % of its rate, at its rate, and saturating it, and checks the stated worst
// case: in every window of length w, at most burst + rate·w +
// min(P·(Tokens−1), rate·MaxAge) tokens are spent; over the whole run no
// more than the bucket gave; leases save store calls below the rate, and
// cost none at or above it.
func TestWindowBound(t *testing.T) {
	const (
		procs  = 4
		tokens = 5
	)
	lim := fleetrate.PerSecond(200, 20)
	for _, c := range []struct {
		name   string
		step   time.Duration // the mean time between takes (of 1.5 tokens)
		maxAge time.Duration
	}{
		{"below the rate", 12500 * time.Microsecond, 500 * time.Millisecond},
		{"at the rate", 7500 * time.Microsecond, 50 * time.Millisecond},
		{"saturated", time.Millisecond, 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := manualclock.New(time.Unix(1_700_000_000, 0))
			inner := &counting{Store: memstore.New(memstore.Options{Clock: clock.Now})}
			var stores []*lease.Store
			for range procs {
				s, err := lease.New(inner, lease.Options{Tokens: tokens, MaxAge: c.maxAge, Clock: clock.Now})
				if err != nil {
					t.Fatal(err)
				}
				stores = append(stores, s)
			}
			b := fleetrate.Bucket{Key: "shared", Limits: []fleetrate.Limit{lim}}
			rng := rand.New(rand.NewPCG(7, 8))
			var grants []time.Time // the clock at each token spent
			start := clock.Now()
			const requests = 3000
			for range requests {
				n := 1 + rng.Int64N(2)
				res := take(t, stores[rng.IntN(procs)], b, n)
				if res.Allowed {
					for range n {
						grants = append(grants, clock.Now())
					}
				}
				clock.Advance(time.Duration(rng.Int64N(int64(2 * c.step))))
			}
			span := clock.Now().Sub(start)
			slack := min(float64(procs*(tokens-1)), lim.Rate*c.maxAge.Seconds())
			excess := 0.0 // the most spent in a window beyond burst + rate × w
			for i := range grants {
				for j := i; j < len(grants); j++ {
					w := grants[j].Sub(grants[i]).Seconds()
					over := float64(j-i+1) - float64(lim.Burst) - lim.Rate*w
					if over > slack {
						t.Fatalf("%d tokens spent in %.4fs; the bound is %.1f", j-i+1, w, float64(lim.Burst)+lim.Rate*w+slack)
					}
					excess = max(excess, over)
				}
			}
			t.Logf("at most %.1f tokens beyond burst + rate × window (the bound allows %.0f)", excess, slack)
			capacity := float64(lim.Burst) + lim.Rate*span.Seconds()
			calls := inner.takes.Load()
			t.Logf("%d tokens spent in %v (%.3f of burst + rate × span), %d store takes for %d requests",
				len(grants), span, float64(len(grants))/capacity, calls, requests)
			if float64(len(grants)) > capacity {
				t.Fatalf("%d tokens spent, more than the bucket gave (%.1f)", len(grants), capacity)
			}
			if c.name == "below the rate" && calls > requests/2 {
				t.Errorf("%d store takes for %d requests below the rate: leases saved too little", calls, requests)
			}
			if calls > requests*21/20 {
				t.Errorf("%d store takes for %d requests: leases cost calls", calls, requests)
			}
		})
	}
}

// TestConcurrentTakes drives one lease store from many goroutines on the
// real clock (run with -race): every grant is a token the bucket gave.
func TestConcurrentTakes(t *testing.T) {
	inner := &counting{Store: memstore.New(memstore.Options{})}
	s, err := lease.New(inner, lease.Options{Tokens: 8, MaxAge: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	lim := fleetrate.PerSecond(1000, 50)
	b := fleetrate.Bucket{Key: "c", Limits: []fleetrate.Limit{lim}}
	var granted atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 16 {
		wg.Go(func() {
			for range 300 {
				res, err := s.Take(context.Background(), fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	bound := float64(lim.Burst) + lim.Rate*time.Since(start).Seconds()
	if float64(granted.Load()) > bound {
		t.Fatalf("%d granted, more than the bucket can give (%.0f)", granted.Load(), bound)
	}
	if granted.Load() == 0 {
		t.Fatal("nothing granted")
	}
}
