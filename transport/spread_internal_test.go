package transport

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// TestSpreadLateWakers: requests of one process woken after their slots
// (the process stalled) go out one interval apart, the one more than two
// intervals late is booked again (once), and on-time requests go at once.
func TestSpreadLateWakers(t *testing.T) {
	tr := &Transport{}
	b := fleetrate.Bucket{Key: "{ota}/avail", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}}
	tk := take{buckets: []fleetrate.Bucket{b, pauseMarker(b)}, paced: 1}
	now := time.Now()

	if d, void := tr.spread(tk, now, false); d != 0 || void {
		t.Fatalf("on time: wait %v, void %v; want 0, false", d, void)
	}
	// Three slots that passed while the process stalled: 130, 80 and 30 ms
	// ago. Each goes one interval (100 ms) after the last.
	var waits []time.Duration
	for _, ago := range []time.Duration{130, 80, 30} {
		d, void := tr.spread(tk, now.Add(-ago*time.Millisecond), false)
		if void {
			t.Fatalf("a request %v late was voided; only more than two intervals late is", ago)
		}
		waits = append(waits, d)
	}
	for i, d := range waits {
		want := time.Duration(i+1) * 100 * time.Millisecond
		if d < want-5*time.Millisecond || d > want+5*time.Millisecond {
			t.Errorf("late request %d waits %v, want about %v (spaced one interval apart)", i, d, want)
		}
	}
	// 250 ms late: booked again, unless it was already once.
	if _, void := tr.spread(tk, now.Add(-250*time.Millisecond), false); !void {
		t.Errorf("a request two and a half intervals late was not voided")
	}
	if _, void := tr.spread(tk, now.Add(-250*time.Millisecond), true); void {
		t.Errorf("a request voided once was voided again")
	}
}
