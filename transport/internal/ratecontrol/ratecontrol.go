// Package ratecontrol is the outbound transport's rate controller: what a
// 429 does to a bucket's effective rate, and how the rate climbs back.
//
// It is pure. Every function takes the time as an argument and returns the
// new state; none reads a clock, takes a lock or calls a store. The
// transport keeps one State per bucket, records the climb in the shared
// store (package hold encodes it) and feeds the evidence of each 429 in.
//
// The climb is CUBIC's (RFC 9438): after a 429 that drew the rate w, the
// effective rate starts from Decrease × w, rises fast at first, flattens as
// it nears w over Recovery, then rises ever faster past it, up to the
// documented rate.
package ratecontrol

import (
	"math"
	"time"
)

// Settings are the controller's tuning, checked by the transport.
type Settings struct {
	// Decrease multiplies the effective rate on a 429, in (0, 1).
	Decrease float64
	// Recovery is how long, after a 429's pause, the rate takes to climb
	// back to the rate that drew it.
	Recovery time.Duration
	// Floor is the lowest effective rate, as a fraction of the documented
	// rate, in (0, 1).
	Floor float64
}

// Climb is one bucket's climb: the rate that drew the last 429 (W, a
// fraction of the documented rate) and when the climb after it began. The
// zero Climb is the documented rate.
type Climb struct {
	W     float64
	Start time.Time // zero: no 429 remembered
}

// Factor returns the effective rate at now as a fraction of the
// documented rate: CUBIC's window w + c·(t − k)³ with k = Recovery and c
// chosen so that it starts at Decrease × w, between the floor and 1,
// rounded up to a step of 1/128 (so that the limits a take sends, and the
// bucket's conversions, change in steps rather than on every take).
func (s Settings) Factor(c Climb, now time.Time) float64 {
	if c.Start.IsZero() {
		return 1
	}
	t := max(now.Sub(c.Start).Seconds(), 0)
	k := s.Recovery.Seconds()
	d := (t - k) / k
	f := c.W + c.W*(1-s.Decrease)*d*d*d
	f = math.Ceil(f*128) / 128
	return min(max(f, s.Floor), 1)
}

// At returns the climb whose factor is f at now: begun at now from
// f / Decrease, or, when that is above 1, part of the way up the climb
// back to 1 (where w + w(1 − Decrease)((t − k)/k)³ = f). It is what an
// operator's SetEffectiveFactor records.
func (s Settings) At(f float64, now time.Time) Climb {
	c := Climb{W: f / s.Decrease, Start: now}
	if c.W > 1 {
		d := -math.Cbrt((1 - f) / (1 - s.Decrease))
		c = Climb{W: 1, Start: now.Add(-time.Duration((1 + d) * float64(s.Recovery)))}
	}
	return c
}

// Lowered returns the climb after a 429 answered at now while the climb
// was c, with the fleet paused until resume and the upstream's limit
// known to lie in [low, high] (see LimitRange). The drop is Decrease, or
// half as far when the 429 came within 10 % of the last one's rate, or
// low is within 10 % of the rate (the limit is known: probing it costs
// less). w is the rate that drew the 429, or, below a high bound that
// says more, halfway between the bound and the drop × the bound (CUBIC's
// fast convergence: the climb then flattens under the limit rather than
// over it), but never below low: a 429 after many admitted requests is
// send jitter on a strict window, or a limit just under the rate, and
// lowering w for it would ratchet the rate down with every such 429. The
// climb starts from the drop × w.
func (s Settings) Lowered(c Climb, now, resume time.Time, low, high float64) Climb {
	f := s.Factor(c, now)
	drop := s.Decrease
	if !c.Start.IsZero() && f >= 0.9*c.W && f <= 1.1*c.W || low >= 0.9*f {
		// Near the rate of the last 429, or after so many admitted
		// requests that the limit lies within 10 % under the rate: the
		// limit is where it was found, so back off half as far.
		drop = 1 - (1-s.Decrease)/2
	}
	// A shallower drop is the same curve begun part of the way up, but
	// never before the last climb began: the store keeps the later start
	// of two (see hold.EncodeClimb), so an earlier one would not be
	// recorded.
	ahead := 1 - math.Cbrt((1-drop)/(1-s.Decrease))
	start := later(resume.Add(-time.Duration(ahead*float64(s.Recovery))), c.Start)
	w := f
	if high < f {
		w = max(high*(1+drop)/2, low) // low ≤ high (see LimitRange)
	}
	// A limit proven above the rate (by the stretch before the last
	// pause: see State.Proven) keeps w there: the 429 was jitter, or the
	// limit fell, which the next 429 shows.
	w = min(max(w, low), 1)
	return Climb{W: max(w, s.Floor), Start: start}
}

// HiddenBurst is the largest burst LimitRange assumes of an upstream's
// limit when it reads how far below the fleet's rate the limit can lie.
// A limit with a larger burst is still found, in more steps (each 429
// lowers the rate by Decrease at least).
const HiddenBurst = 4

// LimitRange reads what a 429 on a request sent at sent tells of the
// upstream's limit, when the fleet resumed from its last pause at resumed
// and has since paced at rate (requests per second; f of the documented
// rate). The fleet sent k = rate × (sent − resumed) requests in between,
// and the upstream admitted the k − 1 before this one. A token bucket
// that held at least one token at the resume (it refilled during the
// pause) and admits them at h per second with a burst of b ≥ 1 has
// b + h·k/rate < k, so h < rate × (1 − 1/k): the high bound it returns,
// as a fraction of the documented rate. One that admitted the k − 1 with
// b ≤ HiddenBurst has b + h·(k − 1)/rate ≥ k − 1, so h ≥ rate × (1 −
// HiddenBurst/(k − 1)): the low bound (0 when that is negative), close to
// the rate after many requests, and never above the high one. Before the
// second request's slot (k < 2) the 429 says the pause was too short, not
// the rate too high: soon. Without a resume to count from it returns 0
// and f.
func LimitRange(f, rate float64, sent, resumed time.Time) (low, high float64, soon bool) {
	if resumed.IsZero() || !resumed.Before(sent) {
		return 0, f, false
	}
	k := rate * sent.Sub(resumed).Seconds()
	if k < 2 {
		return 0, f, true
	}
	return max(f*(1-HiddenBurst/(k-1)), 0), f * (1 - 1/k), false
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
