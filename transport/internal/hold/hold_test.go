package hold

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
)

// TestTakeRead: a booking's debts read by bucket: when each paced
// bucket's next token is free, and how long its pause lasts.
func TestTakeRead(t *testing.T) {
	a := fleetrate.Bucket{Key: "a", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 2)}}
	b := fleetrate.Bucket{Key: "b", Limits: []fleetrate.Limit{fleetrate.PerSecond(20, 1), fleetrate.PerSecond(1, 60)}}
	tk := Layout([]fleetrate.Bucket{a, b})
	if got := len(tk.Markers()); got != 2 || tk.Markers()[1].Key != "b#pause" {
		t.Fatalf("markers %v", tk.Markers())
	}
	ms := int64(time.Millisecond)
	booking := fleetrate.Booking{Debts: []int64{
		300 * ms,         // a: 300 ms of debt, burst 2 (100 ms interval) → next in 200 ms
		50 * ms, 10 * ms, // b: 50 ms at 20/s burst 1 → 50 ms; the minute limit's 10 ms − 59 s → none
		int64(Fill) + 2*int64(time.Second), // a's pause: 2 s
		int64(Fill) - 5,                    // b's: none
	}}
	seen, ok := tk.Read(booking)
	if !ok {
		t.Fatal("Read refused a booking of the take's layout")
	}
	want := []Seen{{Next: 200 * time.Millisecond, Pause: 2 * time.Second}, {Next: 50 * time.Millisecond}}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("bucket %d: %+v, want %+v", i, seen[i], want[i])
		}
	}
	if _, ok := tk.Read(fleetrate.Booking{Debts: []int64{1, 2}}); ok {
		t.Error("Read accepted a booking of another layout")
	}
}

// TestClimbRoundTrip: a climb encoded in the markers reads back the same
// (to the marker's nanosecond), read at any later time.
func TestClimbRoundTrip(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, c := range []ratecontrol.Climb{{W: 1, Start: now}, {W: 0.42, Start: now.Add(-time.Minute)}, {W: 0.05, Start: now.Add(2 * time.Second)}} {
		rate, peak := EncodeClimb(c, now)
		later := now.Add(7 * time.Second)
		got := DecodeClimb(rate-7*time.Second, peak-7*time.Second, later)
		if !got.Start.Equal(c.Start) || got.W < c.W-1e-9 || got.W > c.W+1e-9 {
			t.Errorf("climb %+v read back as %+v", c, got)
		}
	}
	if got := DecodeClimb(0, 0, now); got != (ratecontrol.Climb{}) {
		t.Errorf("empty markers read as %+v, want no climb", got)
	}
}
