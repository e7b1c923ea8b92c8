package ratecontrol

import (
	"math"
	"time"
)

// This file is the controller's second kind of evidence: an upstream that
// states its limit in its answers' headers (see package ratelimitheader).
// A 429 says the rate was too high and the climb probes for the limit; a
// stated limit says where it is, so the effective rate is capped there
// instead of probing past it. A statement never raises the rate above the
// documented one, nor the climb: the cap only lowers.

// Step is the granularity of effective rates (see Settings.Factor): a
// ceiling is rounded down to it, so a stated limit is never exceeded by
// the rounding that Factor does upward.
const Step = 1.0 / 128

// Ceiling returns the cap a stated limit of rate (per second) puts on a
// bucket documented at documented (per second), as a fraction of it:
// rounded down to Step, at least the floor, and 0 (no cap) when the
// statement is at or above the documented rate, or not a rate.
func (s Settings) Ceiling(rate, documented float64) float64 {
	if !(rate > 0) || !(documented > 0) || math.IsInf(rate, 0) || rate >= documented {
		return 0
	}
	return max(math.Floor(rate/documented/Step)*Step, s.Floor)
}

// Effective returns the effective rate at now, as a fraction of the
// documented rate: the climb's factor, capped by the ceiling stated last
// while it holds.
func (s Settings) Effective(st State, now time.Time) float64 {
	f := s.Factor(st.Climb, now)
	if c := st.ceiling(now); c > 0 {
		f = min(f, c)
	}
	return f
}

// Stated returns the state after an answer stated a ceiling (see
// Ceiling; 0 states none below the documented rate) at now, to hold for
// keep unless stated again, and whether the effective rate fell by it:
// then the slots booked at the old rate are to be voided. A later
// statement replaces an earlier one, up or down; a statement of none
// lifts the cap. A ceiling no answer restates within keep lapses (an
// upstream that stopped sending the fields, or changed its limit without
// saying), and the climb probes again.
func (s Settings) Stated(st State, ceiling float64, now time.Time, keep time.Duration) (next State, lowered bool) {
	before := s.Effective(st, now)
	st.Ceiling, st.CeilingUntil = ceiling, now.Add(keep)
	return st, s.Effective(st, now) < before
}

// CeilingKeep is how long a ceiling stated with a window of w holds
// unless an answer states it again: ten windows, at least a minute.
func CeilingKeep(w time.Duration) time.Duration {
	return max(10*w, time.Minute)
}

// ceiling returns the ceiling in force at now: 0 when none was stated or
// it lapsed.
func (st State) ceiling(now time.Time) float64 {
	if st.Ceiling > 0 && now.Before(st.CeilingUntil) {
		return st.Ceiling
	}
	return 0
}

// capped returns the climb a 429 is judged against: c, or, when the
// ceiling held the rate below c's factor at now, the climb standing at the
// ceiling (begun Recovery ago from w = the ceiling, where the curve is
// flat): the 429 was drawn at the stated limit, not at the climb's rate.
func (s Settings) capped(st State, now time.Time) Climb {
	if c := st.ceiling(now); c > 0 && c < s.Factor(st.Climb, now) {
		return Climb{W: c, Start: now.Add(-s.Recovery)}
	}
	return st.Climb
}
