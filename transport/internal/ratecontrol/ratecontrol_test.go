package ratecontrol

import (
	"math"
	"testing"
	"time"
)

var defaults = Settings{Decrease: 0.85, Recovery: 90 * time.Second, Floor: 0.05}

// TestFactorTimeline pins the climb on a fixed timeline: from Decrease ×
// w at the start, up to w at Recovery, flat near it, past it after, never
// above 1 nor below the floor, in steps of 1/128.
func TestFactorTimeline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := Climb{W: 0.8, Start: t0}
	for _, step := range []struct {
		at   time.Duration
		want float64
	}{
		{-time.Second, 0.6875},     // before the start: as at the start
		{0, 0.6875},                // Decrease × w = 0.68, rounded up to 88/128
		{30 * time.Second, 0.7656}, // fast at first
		{60 * time.Second, 0.7969}, // flattening
		{90 * time.Second, 0.8047}, // w, rounded up to a step
		{120 * time.Second, 0.8047},
		{180 * time.Second, 0.9219}, // past w, ever faster
		{300 * time.Second, 1},      // capped at the documented rate
	} {
		got := defaults.Factor(c, t0.Add(step.at))
		if math.Abs(got-step.want) > 0.0001 {
			t.Errorf("Factor at %v = %.4f, want %.4f", step.at, got, step.want)
		}
		if got != math.Ceil(got*128)/128 {
			t.Errorf("Factor at %v = %v, not a step of 1/128", step.at, got)
		}
	}
	if got := defaults.Factor(Climb{}, t0); got != 1 {
		t.Errorf("no climb: Factor = %v, want 1", got)
	}
	if got := defaults.Factor(Climb{W: 0.01, Start: t0}, t0); got != defaults.Floor {
		t.Errorf("a climb from below the floor: Factor = %v, want the floor %v", got, defaults.Floor)
	}
}

// TestAt: the climb At returns has the asked factor at once, and climbs
// back to 1 from it.
func TestAt(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, f := range []float64{0.05, 0.5, 0.85, 0.9, 0.99} {
		c := defaults.At(f, now)
		if got := defaults.Factor(c, now); math.Abs(got-f) > 1.0/128 {
			t.Errorf("At(%v): Factor now = %v", f, got)
		}
		if got := defaults.Factor(c, now.Add(10*time.Minute)); got != 1 {
			t.Errorf("At(%v): Factor 10 minutes on = %v, want 1", f, got)
		}
	}
}

// TestLimitRange: what a 429 tells of the limit, from the requests the
// fleet sent at its rate since its last pause.
func TestLimitRange(t *testing.T) {
	resumed := time.Unix(1000, 0)
	for _, c := range []struct {
		name      string
		f, rate   float64
		sent      time.Time
		resumed   time.Time
		low, high float64
		wantSoon  bool
	}{
		{"no pause to count from", 0.8, 8, resumed, time.Time{}, 0, 0.8, false},
		{"sent before the resume", 0.8, 8, resumed.Add(-time.Second), resumed, 0, 0.8, false},
		{"first request after the pause", 0.8, 8, resumed.Add(130 * time.Millisecond), resumed, 0, 0.8, true},
		{"second request", 0.8, 8, resumed.Add(250 * time.Millisecond), resumed, 0, 0.4, false},
		{"fifth request", 0.8, 8, resumed.Add(625 * time.Millisecond), resumed, 0, 0.64, false},
		{"after 8 intervals", 0.8, 8, resumed.Add(time.Second), resumed, 0.8 * (1 - 4.0/7), 0.7, false},
		{"long after", 0.8, 8, resumed.Add(100 * time.Second), resumed, 0.8 * (1 - 4.0/799), 0.799, false},
	} {
		low, high, soon := LimitRange(c.f, c.rate, c.sent, c.resumed)
		if soon != c.wantSoon || math.Abs(high-c.high) > 0.001 || math.Abs(low-c.low) > 0.001 {
			t.Errorf("%s: LimitRange = %v, %v, %v; want %v, %v, %v", c.name, low, high, soon, c.low, c.high, c.wantSoon)
		}
	}
}

// TestLoweredAfterManyAdmitted: a 429 that came after hundreds of admitted
// requests (send jitter on a strict window, or a limit just under the
// rate) lowers where the climb flattens only to what the admitted
// requests prove the limit is at least, so that a fleet that draws such a
// 429 every minute does not ratchet its rate down; one after a few
// admitted requests still lowers it below them.
func TestLoweredAfterManyAdmitted(t *testing.T) {
	start := time.Unix(1000, 0)
	c := Climb{W: 1, Start: start}
	now := start.Add(60 * time.Second)
	f := defaults.Factor(c, now)
	resumed := start.Add(-2 * time.Second)
	rate := 19 * f
	low, high, _ := LimitRange(f, rate, now, resumed) // about 1,170 admitted
	got := defaults.Lowered(c, now, now.Add(2*time.Second), low, high)
	if got.W < low || got.W > f {
		t.Fatalf("after ~1,170 admitted requests w = %v, want in [%v, %v]", got.W, low, f)
	}
	if to := defaults.Factor(got, now.Add(2*time.Second)); to >= f {
		t.Fatalf("the rate after the 429 = %v, want below %v", to, f)
	}
	low, high, _ = LimitRange(f, rate, resumed.Add(400*time.Millisecond), resumed) // about 7 admitted
	if got := defaults.Lowered(c, now, now.Add(2*time.Second), low, high); got.W > high {
		t.Fatalf("after ~7 admitted requests w = %v, want below the bound %v", got.W, high)
	}
}

// TestLoweredKeepsTheMarkersOrder: a climb lowered soon after the last one
// began never starts before it (the markers keep the later start of two,
// so an earlier one would not be what the fleet reads).
func TestLoweredKeepsTheMarkersOrder(t *testing.T) {
	start := time.Unix(1000, 0)
	c := Climb{W: 0.7, Start: start}
	now := start.Add(3 * time.Second) // near w: a shallow drop
	got := defaults.Lowered(c, now, now.Add(2*time.Second), 0, 1)
	if got.Start.Before(start) {
		t.Fatalf("lowered climb starts %v before the last one", start.Sub(got.Start))
	}
	if got.W > defaults.Factor(c, now) {
		t.Fatalf("lowered w = %v above the rate that drew the 429 (%v)", got.W, defaults.Factor(c, now))
	}
}
