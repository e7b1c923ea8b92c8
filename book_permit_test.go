package fleetrate_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
)

// TestBookTakesAndHoldsAPermit: Book of a bucket with an in-flight bound
// takes a permit with the tokens and holds it, renewed, past its lease;
// a second Book waits in the queue for it and is granted exactly when the
// first releases; a Book that may not wait is refused at once.
func TestBookTakesAndHoldsAPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := permitLimiter(t, 1, time.Minute)
		b, err := l.Bucket("api")
		if err != nil {
			t.Fatal(err)
		}
		first, err := l.Book(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: time.Second})
		if err != nil || first.Result.InFlight.Held != 1 {
			t.Fatalf("first Book: %+v, %v; want a permit held", first, err)
		}
		if _, err := l.Book(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1}); !errors.Is(err, fleetrate.ErrBackpressure) {
			t.Fatalf("Book that may not wait, permit held: %v; want backpressure", err)
		}
		start := time.Now()
		got := make(chan time.Duration, 1)
		go func() {
			r, err := l.Book(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: time.Second})
			if err != nil {
				t.Errorf("second Book: %v", err)
				got <- -1
				return
			}
			got <- time.Since(start)
			_ = r.Release(ctx)
		}()
		time.Sleep(2 * l.PermitTTL()) // renewed all along
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("the second Book was granted while the first held the permit")
		}
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if d := <-got; d != 2*l.PermitTTL() {
			t.Errorf("second Book granted after %v; want %v, at the release", d, 2*l.PermitTTL())
		}
	})
}

// TestAbandonLetsThePermitLapse: an abandoned permit is no longer renewed
// and comes back exactly when its lease ends.
func TestAbandonLetsThePermitLapse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := permitLimiter(t, 1, time.Minute)
		r, err := l.TryAcquire(ctx, "api")
		if err != nil || !r.Result.Allowed {
			t.Fatalf("TryAcquire: %v", err)
		}
		time.Sleep(l.PermitTTL() / 2) // renewed once, at a third
		r.Abandon()
		renewed := time.Now().Add(-l.PermitTTL()/2 + l.PermitTTL()/3)
		time.Sleep(time.Until(renewed.Add(l.PermitTTL())) - time.Millisecond)
		if again, err := l.TryAcquire(ctx, "api"); err != nil || again.Result.Allowed {
			t.Fatalf("1 ms before the lease ends: allowed %v, %v; want still held", again != nil && again.Result.Allowed, err)
		}
		time.Sleep(time.Millisecond)
		if again, err := l.TryAcquire(ctx, "api"); err != nil || !again.Result.Allowed {
			t.Fatalf("at the lease's end: %v; want the permit back", err)
		}
	})
}

// TestBookSettlesItsCosts: a Book with costs by bucket can be settled.
func TestBookSettlesItsCosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		l := permitLimiter(t, 0, time.Minute)
		b, _ := l.Bucket("api")
		r, err := l.Book(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, Costs: []int64{500}})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(ctx, fleetrate.Cost{Bucket: "api", N: 900}); err != nil {
			t.Fatal(err)
		}
		res, err := l.Peek(ctx, "api")
		if err != nil || res.Remaining != 100 {
			t.Errorf("remaining %d, %v; want 100 (1,000 less the 900 settled)", res.Remaining, err)
		}
	})
}
