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

// TestLimitBound: what a 429 tells of the limit, from the requests the
// fleet sent at its rate since its last pause.
func TestLimitBound(t *testing.T) {
	resumed := time.Unix(1000, 0)
	for _, c := range []struct {
		name     string
		f, rate  float64
		sent     time.Time
		resumed  time.Time
		bound    float64
		wantSoon bool
	}{
		{"no pause to count from", 0.8, 8, resumed, time.Time{}, 0.8, false},
		{"sent before the resume", 0.8, 8, resumed.Add(-time.Second), resumed, 0.8, false},
		{"first request after the pause", 0.8, 8, resumed.Add(130 * time.Millisecond), resumed, 0.8, true},
		{"second request", 0.8, 8, resumed.Add(250 * time.Millisecond), resumed, 0.4, false},
		{"after 8 intervals", 0.8, 8, resumed.Add(time.Second), resumed, 0.7, false},
		{"long after", 0.8, 8, resumed.Add(100 * time.Second), resumed, 0.799, false},
	} {
		bound, soon := limitBound(c.f, c.rate, c.sent, c.resumed)
		if soon != c.wantSoon || bound < c.bound-0.001 || bound > c.bound+0.001 {
			t.Errorf("%s: limitBound = %v, %v; want %v, %v", c.name, bound, soon, c.bound, c.wantSoon)
		}
	}
}

// TestLoweredKeepsTheMarkersOrder: a climb lowered soon after the last one
// began never starts before it (the markers keep the later start of two,
// so an earlier one would not be what the fleet reads).
func TestLoweredKeepsTheMarkersOrder(t *testing.T) {
	a, _ := Adaptive{}.withDefaults()
	start := time.Unix(1000, 0)
	c := climb{w: 0.7, start: start}
	now := start.Add(3 * time.Second) // near w: a shallow drop
	got := a.lowered(c, now, now.Add(2*time.Second), 1)
	if got.start.Before(start) {
		t.Fatalf("lowered climb starts %v before the last one", start.Sub(got.start))
	}
	if got.w > a.factor(c, now) {
		t.Fatalf("lowered w = %v above the rate that drew the 429 (%v)", got.w, a.factor(c, now))
	}
}

// TestAdmittedEndsTheRow: an answer other than a rate limit ends a row of
// 429s taken as pauses too short, so the next row may again blame the
// pause (a 429 by another process lowered the rate in between; this
// process's count would otherwise carry over and lower it once more).
func TestAdmittedEndsTheRow(t *testing.T) {
	tr := &Transport{}
	tg := Target{Channel: "ota", Endpoint: "avail"}
	key := EndpointBucket(tg.Channel, tg.Endpoint)
	tr.views.setSoon(tr.views.get(key), maxSoon)
	tr.admitted(tg)
	if n := tr.views.get(key).soon; n != 0 {
		t.Fatalf("after an admitted request the row is %d long, want 0", n)
	}
	if n := tr.views.inRow.Load(); n != 0 {
		t.Fatalf("after the row ended %d views count as in a row, want 0", n)
	}
}
