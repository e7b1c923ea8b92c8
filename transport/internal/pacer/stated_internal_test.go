package pacer

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/transport/internal/ratelimitheader"
)

// TestHoldDown: the hold after which a bucket refilling from empty at
// rate grants no more than what remains before the reset.
func TestHoldDown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		q    ratelimitheader.Quota
		rate float64
		want time.Duration
	}{
		{"nothing left for 2 s", ratelimitheader.Quota{Remaining: 0, Reset: 2 * time.Second}, 10, 2 * time.Second},
		{"5 left for 2 s at 10/s", ratelimitheader.Quota{Remaining: 5, Reset: 2 * time.Second}, 10, 1500 * time.Millisecond},
		{"as many as the bucket grants", ratelimitheader.Quota{Remaining: 20, Reset: 2 * time.Second}, 10, 0},
		{"more", ratelimitheader.Quota{Remaining: 4999, Reset: time.Hour}, 1, 0},
		{"an hour's quota nearly spent", ratelimitheader.Quota{Remaining: 100, Reset: time.Hour}, 1, time.Hour - 100*time.Second},
		{"no reset stated", ratelimitheader.Quota{Remaining: 0}, 10, 0},
		{"no rate", ratelimitheader.Quota{Remaining: 0, Reset: time.Second}, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := HoldDown(c.q, c.rate); got != c.want {
				t.Errorf("HoldDown(%+v, %v) = %v, want %v", c.q, c.rate, got, c.want)
			}
		})
	}
}
