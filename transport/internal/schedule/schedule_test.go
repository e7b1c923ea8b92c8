package schedule

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
)

// stubFleet is a Fleet whose knowledge the test sets: a hold until
// heldUntil, and Spread answers void the first voids times.
type stubFleet struct {
	heldUntil time.Time
	voids     int
	spreads   int
}

func (f *stubFleet) HeldUntil([]fleetrate.Bucket, time.Time) (time.Time, bool) {
	return f.heldUntil, true
}
func (f *stubFleet) HeldSince([]fleetrate.Bucket, time.Time) bool { return false }
func (f *stubFleet) NextFree([]fleetrate.Bucket) time.Time        { return time.Time{} }
func (f *stubFleet) Layout(_ context.Context, paced []fleetrate.Bucket) hold.Take {
	return hold.Layout(paced)
}
func (f *stubFleet) Learn(hold.Take, fleetrate.Booking, time.Time) bool { return false }
func (f *stubFleet) LearnNext(string, time.Time)                        {}
func (f *stubFleet) Spread(_ []fleetrate.Bucket, _, _ time.Time) (time.Duration, bool) {
	f.spreads++
	if f.spreads <= f.voids {
		return 0, true
	}
	return 0, false
}
func (f *stubFleet) Listening(time.Time) bool { return true }
func (f *stubFleet) ReadHolds(context.Context, hold.Take, fleetrate.Booking) (bool, error) {
	return false, nil
}

func request(t *testing.T, f Fleet, maxWait time.Duration) *Request {
	t.Helper()
	lim, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "ota/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := lim.Bucket("ota/avail")
	if err != nil {
		t.Fatal(err)
	}
	return &Request{
		Name: "ota/avail", Fleet: f, Limiter: lim, Paced: []fleetrate.Bucket{b}, N: 1,
		Start: time.Now(), MaxWait: maxWait, Lookahead: 250 * time.Millisecond,
		Now: time.Now, Failed: func(err error) error { return err },
		Rebooked: func() {}, GiveBack: time.Second,
	}
}

// TestOutsideSitsOutAKnownHold: a request waits out a hold this process
// knows of, booking Lead before it ends, and one whose hold outlasts its
// budget fails at once with backpressure.
func TestOutsideSitsOutAKnownHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &stubFleet{heldUntil: time.Now().Add(2 * time.Second)}
		q := request(t, f, 5*time.Second)
		start := time.Now()
		if err := q.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited < 2*time.Second-Lead {
			t.Fatalf("sent %v after the start, inside a hold of 2s (booking %v ahead)", waited, Lead)
		}

		f = &stubFleet{heldUntil: time.Now().Add(10 * time.Second)}
		q = request(t, f, 5*time.Second)
		var bp *fleetrate.BackpressureError
		if err := q.Wait(context.Background()); !errors.As(err, &bp) {
			t.Fatalf("a hold of 10s with a 5s budget: %v, want backpressure", err)
		}
	})
}

// TestVerifyBooksAgainWhenLate: a booking the send-time discipline calls
// void is given back and booked again, and the request then goes.
func TestVerifyBooksAgainWhenLate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &stubFleet{voids: 2}
		q := request(t, f, 5*time.Second)
		if err := q.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
		if f.spreads != 3 {
			t.Fatalf("Spread asked %d times, want 3 (two void bookings, then the send)", f.spreads)
		}
	})
}
