package fleetrate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// TestMisuseIsAnError: a Limiter that New did not make, a nil store of a
// typed nil, a nil Reservation and a drain until a far date answer an
// error wrapping ErrInvalid that says what is wrong, never a panic.
func TestMisuseIsAnError(t *testing.T) {
	t.Parallel()
	var zero fleetrate.Limiter
	ctx := context.Background()
	for name, f := range map[string]func() error{
		"Allow":      func() error { _, err := zero.Allow(ctx, "k"); return err },
		"AllowN":     func() error { _, err := zero.AllowN(ctx, 1, "k"); return err },
		"Peek":       func() error { _, err := zero.Peek(ctx, "k"); return err },
		"Wait":       func() error { _, err := zero.Wait(ctx, "k"); return err },
		"Reserve":    func() error { _, err := zero.Reserve(ctx, "k"); return err },
		"Book":       func() error { _, err := zero.Book(ctx, fleetrate.Request{}); return err },
		"Refund":     func() error { return zero.Refund(ctx, fleetrate.Result{Allowed: true, N: 1, At: time.Now()}, "k") },
		"Drain":      func() error { return zero.Drain(ctx, time.Second, "k") },
		"DrainUntil": func() error { return zero.DrainUntil(ctx, time.Now(), "k") },
		"Reset":      func() error { return zero.Reset(ctx, "k") },
		"New with a typed nil store": func() error {
			_, err := fleetrate.New((*memstore.Store)(nil), fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
			return err
		},
		"Cancel of a nil Reservation": func() error { return (*fleetrate.Reservation)(nil).Cancel(ctx) },
		"Sleep of a nil Reservation":  func() error { return (*fleetrate.Reservation)(nil).Sleep(ctx) },
	} {
		t.Run(name, func(t *testing.T) {
			err := f()
			if name == "Cancel of a nil Reservation" {
				if err != nil {
					t.Fatalf("a nil reservation has nothing to give back: %v", err)
				}
				return
			}
			if !errors.Is(err, fleetrate.ErrInvalid) {
				t.Fatalf("%v, want an error wrapping ErrInvalid", err)
			}
		})
	}
	l, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := l.DrainUntil(ctx, far, "k"); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "drain until 9999") {
		t.Fatalf("drain until 9999: %v, want an error naming the date", err)
	}
}

// TestCancelFromTwoGoroutines: Cancel is safe to call at once from
// several goroutines (Sleep's, when its context ends, and the holder's);
// the booking goes back once. Run with -race.
func TestCancelFromTwoGoroutines(t *testing.T) {
	t.Parallel()
	// A slot a minute ahead: the cancels come long before it begins.
	l, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.Every(time.Minute, 1)}, MaxWait: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Allow(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	r, err := l.Reserve(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := r.Cancel(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	next, err := l.Reserve(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	slot := func(r *fleetrate.Reservation) time.Time { return r.Result.At.Add(r.Result.Wait) }
	if !slot(next).Equal(slot(r)) {
		t.Fatalf("after the cancel the next booking's slot is %v, want the cancelled one's, %v", slot(next), slot(r))
	}
}
