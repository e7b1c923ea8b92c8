package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// drainEach checks that one DrainEach drains each bucket for its own
// duration, that a void drain voids what was booked beyond it, and that a
// bucket named twice is refused (not deadlocked on).
func drainEach(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.PerSecond(1, 1)
	a := fleetrate.Bucket{Key: key("{e}:a"), Limits: []fleetrate.Limit{lim}}
	b := fleetrate.Bucket{Key: key("{e}:b"), Limits: []fleetrate.Limit{lim}}
	// b is booked 30 s ahead; a void drain of 2 s voids that.
	if err := s.Drain(ctx, []fleetrate.Bucket{b}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	err := s.DrainEach(ctx, []fleetrate.Drain{{Bucket: a, For: 5 * time.Second}, {Bucket: b, For: 2 * time.Second, Void: true}})
	if err != nil {
		t.Fatal(err)
	}
	ra := mustTake(t, s, one(a.Key, 1, 0, lim))
	rb := mustTake(t, s, one(b.Key, 1, 0, lim))
	if ra.Allowed || ra.RetryAfter > 6*time.Second || ra.RetryAfter < 5*time.Second {
		t.Fatalf("bucket drained 5 s: %+v, want denied for about 6 s", ra)
	}
	if rb.Allowed || rb.RetryAfter > 3*time.Second || rb.RetryAfter < 2*time.Second {
		t.Fatalf("bucket booked 30 s ahead, then void-drained 2 s: %+v, want denied for about 3 s", rb)
	}
	for _, bad := range []struct {
		drains []fleetrate.Drain
		want   string
	}{
		{nil, "at least one"},
		{[]fleetrate.Drain{{Bucket: a, For: -1}}, "drains[0]"},
		{[]fleetrate.Drain{{Bucket: a}, {Bucket: a}}, "appears twice"},
	} {
		if err := s.DrainEach(ctx, bad.drains); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("DrainEach(%v): %v, want ErrInvalid naming %q", bad.drains, err, bad.want)
		}
	}
	// A bucket named twice in any call is refused.
	done := make(chan error, 1)
	go func() { done <- s.Drain(ctx, []fleetrate.Bucket{a, a}, time.Second) }()
	select {
	case err := <-done:
		if !errors.Is(err, fleetrate.ErrInvalid) {
			t.Fatalf("Drain of one bucket twice: %v, want ErrInvalid", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Drain of one bucket twice did not return in 30 s")
	}
}
