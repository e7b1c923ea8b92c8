package ratecontrol

import (
	"math"
	"testing"
	"time"
)

func TestCeiling(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name             string
		rate, documented float64
		want             float64
	}{
		{"hidden 12/s under 19/s: rounded down", 12, 19, 80.0 / 128},
		{"exactly a step", 9.5, 19, 64.0 / 128},
		{"at the documented rate: no cap", 19, 19, 0},
		{"above it: no cap, never a raise", 40, 19, 0},
		{"far below: the floor", 0.01, 19, defaults.Floor},
		{"zero: not a rate", 0, 19, 0},
		{"negative", -1, 19, 0},
		{"NaN", math.NaN(), 19, 0},
		{"infinite", math.Inf(1), 19, 0},
		{"no documented rate", 12, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := defaults.Ceiling(c.rate, c.documented); got != c.want {
				t.Errorf("Ceiling(%v, %v) = %v, want %v", c.rate, c.documented, got, c.want)
			}
		})
	}
}

// TestStated runs statements on a fixed timeline: a cap lowers the
// effective rate (and says so), a higher one or none lifts it back to the
// climb's, and a cap above the climb's factor after a 429 changes nothing.
func TestStated(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	climbing := Climb{W: 0.8, Start: t0} // factor 0.8 × 0.85 at t0
	for _, c := range []struct {
		name        string
		st          State
		ceiling     float64
		at          time.Time
		want        float64 // effective after
		wantLowered bool
	}{
		{"first statement below the documented rate", State{}, 0.625, t0, 0.625, true},
		{"the same again", State{Ceiling: 0.625, CeilingUntil: forever}, 0.625, t0, 0.625, false},
		{"a lower one", State{Ceiling: 0.625, CeilingUntil: forever}, 0.5, t0, 0.5, true},
		{"a higher one lifts the cap", State{Ceiling: 0.5, CeilingUntil: forever}, 0.625, t0, 0.625, false},
		{"none lifts it to the documented rate", State{Ceiling: 0.5, CeilingUntil: forever}, 0, t0, 1, false},
		{"above a climb after a 429: the climb rules", State{Climb: climbing}, 0.9, t0, defaults.Factor(climbing, t0), false},
		{"below the climb: caps it", State{Climb: climbing}, 0.5, t0, 0.5, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			st, lowered := defaults.Stated(c.st, c.ceiling, c.at, time.Hour)
			if got := defaults.Effective(st, c.at); got != c.want || lowered != c.wantLowered {
				t.Errorf("Stated(%+v, %v): effective %v lowered %v, want %v %v", c.st, c.ceiling, got, lowered, c.want, c.wantLowered)
			}
			if got, climb := defaults.Effective(st, c.at), defaults.Factor(st.Climb, c.at); got > climb {
				t.Errorf("effective %v above the climb's %v: a statement raised the rate", got, climb)
			}
		})
	}
}

// forever is a ceiling's end beyond every test's timeline.
var forever = time.Unix(1<<40, 0)

// TestCeilingLapses: a ceiling holds for its keep after the answer that
// stated it, longer when restated, and then lapses: the climb rules again.
func TestCeilingLapses(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	keep := CeilingKeep(time.Second)
	if keep != time.Minute || CeilingKeep(time.Minute) != 10*time.Minute {
		t.Fatalf("CeilingKeep: %v for a 1 s window, %v for a minute; want 1m, 10m", keep, CeilingKeep(time.Minute))
	}
	st, _ := defaults.Stated(State{}, 0.5, t0, keep)
	if f := defaults.Effective(st, t0.Add(keep-time.Nanosecond)); f != 0.5 {
		t.Errorf("just before the keep ends: %v, want the ceiling 0.5", f)
	}
	if f := defaults.Effective(st, t0.Add(keep)); f != 1 {
		t.Errorf("once the keep ends: %v, want the documented rate 1", f)
	}
	st, _ = defaults.Stated(st, 0.5, t0.Add(keep/2), keep)
	if f := defaults.Effective(st, t0.Add(keep)); f != 0.5 {
		t.Errorf("restated halfway: %v at the first keep's end, want 0.5", f)
	}
}

// TestLimitedUnderACeiling: a 429 drawn while a stated ceiling held the
// rate is judged at the ceiling, not at the climb's higher factor: the
// rate falls from the ceiling, w stays at most the ceiling, and the climb
// back never passes it.
func TestLimitedUnderACeiling(t *testing.T) {
	t.Parallel()
	start := time.Unix(1000, 0)
	now := start.Add(49 * time.Second)
	st := State{Ceiling: 0.625, CeilingUntil: forever}
	next, ch, _, ok := defaults.Limited(st, evidence(now, time.Time{}, start, false))
	if !ok {
		t.Fatal("a 429 under a ceiling lowered nothing")
	}
	if ch.From != 0.625 {
		t.Errorf("from = %v, want the ceiling 0.625", ch.From)
	}
	if ch.To >= 0.625 || ch.To < 0.625*defaults.Decrease-Step {
		t.Errorf("to = %v, want between %v and the ceiling", ch.To, 0.625*defaults.Decrease)
	}
	if ch.Climb.W > 0.625 {
		t.Errorf("w = %v above the ceiling", ch.Climb.W)
	}
	if next.Ceiling != 0.625 {
		t.Errorf("the ceiling went: %+v", next)
	}
	for d := time.Duration(0); d < 10*defaults.Recovery; d += defaults.Recovery / 4 {
		if f := defaults.Effective(next, now.Add(2*time.Second+d)); f > 0.625 {
			t.Fatalf("%v after the pause the rate is %v, above the ceiling", d, f)
		}
	}
}
