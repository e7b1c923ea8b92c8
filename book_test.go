package fleetrate_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Book takes buckets the caller built (a configured bucket at a slower
// rate, and a bucket of its own), times the slot like WaitN and cancels
// exactly.
func TestBookCallerBuiltBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
			{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}},
		}})
		api, err := l.Bucket("api")
		if err != nil {
			t.Fatal(err)
		}
		api.Limits = []fleetrate.Limit{fleetrate.PerSecond(5, 1)} // adapted: half the rate
		own := fleetrate.Bucket{Key: "api#own", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1)}}
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{api, own}, N: 1, MaxWait: time.Second}
		start := time.Now()
		for i := range 3 {
			r, err := l.Book(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if want := start.Add(time.Duration(i) * 200 * time.Millisecond); !r.Due().Equal(want) {
				t.Fatalf("booking %d due %v after start, want %v", i, r.Due().Sub(start), want.Sub(start))
			}
			if got := len(r.Booking().Debts); got != 2 {
				t.Fatalf("booking %d reports %d debts, want 2 (one per limit)", i, got)
			}
			if i == 2 {
				// The latest booking goes back: the next is due in its place.
				if err := r.Cancel(t.Context()); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := r.Sleep(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		r, err := l.Book(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := r.Due().Sub(start), 400*time.Millisecond; got != want {
			t.Fatalf("after a cancel the next booking is due %v after start, want %v", got, want)
		}
	})
}

func TestBookRejectsMaxWaitAboveLimiters(t *testing.T) {
	l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}, MaxWait: time.Second})
	b, err := l.Bucket("k")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Book(t.Context(), fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: 2 * time.Second})
	if !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("max wait above the limiter's: got %v, want ErrInvalid", err)
	}
}

// A slot after the caller's deadline is given back and reported as
// backpressure by Sleep.
func TestReservationSleepPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(t, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}})
		if _, err := l.Reserve(t.Context(), "k"); err != nil {
			t.Fatal(err)
		}
		r, err := l.Reserve(t.Context(), "k") // due in 100 ms
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		var bp *fleetrate.BackpressureError
		if err := r.Sleep(ctx); !errors.As(err, &bp) {
			t.Fatalf("Sleep past the deadline: got %v, want a *BackpressureError", err)
		}
		if r2, err := l.Reserve(t.Context(), "k"); err != nil || r2.Delay() != 100*time.Millisecond {
			t.Fatalf("after the give-back the next slot should be the given-back one (100ms): %v, %v", r2, err)
		}
	})
}
