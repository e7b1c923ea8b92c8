// Package hold is the transport's one notion of "this bucket is held until
// t", kept in the shared store beside a paced bucket, and the layout in
// which a take reads it.
//
// A hold is a marker: a bucket of its own whose debt carries a duration.
// Its limit is a token per nanosecond with a burst of 2^40, so it fills in
// Fill (about 18 minutes), and a drain for d leaves a debt of d + Fill
// that decays with time like any debt. What lies beyond Fill is the state;
// a take adds a nanosecond, and its booked wait, far below Fill.
//
// Three holds exist:
//   - bucket#pause, the fleet's pause after a 429: every take of the
//     bucket also takes from it, in the same atomic call, so a take while
//     it is drained waits out the pause (the fleet queues behind it,
//     booked in order, no polling), and its booking reports the pause to
//     every process at no extra call (Take.Read);
//   - bucket#hold, the spacing gate's hold after a late answer (Gate);
//   - bucket#rate and bucket#peak, which record the rate controller's
//     climb (EncodeClimb, DecodeClimb): not a hold of takes, but the same
//     decaying state.
package hold

import (
	"context"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
)

// Limit is every marker's limit: a token per nanosecond, a burst of 2^40.
var Limit = fleetrate.Limit{Name: "marker", Rate: 1e9, Burst: 1 << 40}

// Fill is how long an empty marker takes to fill: the debt below which a
// marker holds nothing.
var Fill = Limit.FillTime()

// PauseLimit is the pause marker's limit (Limit, named "pause").
var PauseLimit = Limit.Named("pause")

// MaxMarkedWait is the longest wait a take may book with its pause
// markers: a booked wait pushes a marker's debt to it, which must stay
// below Fill to be told from a pause.
const MaxMarkedWait = 10 * time.Minute

// State returns what a marker holds, from its debt: how long it is held.
func State(debt int64) time.Duration {
	return max(time.Duration(debt)-Fill, 0)
}

// PauseKey returns the key of bucket key's pause marker.
func PauseKey(key string) string { return key + "#pause" }

// Pause returns bucket b's pause marker.
func Pause(b fleetrate.Bucket) fleetrate.Bucket {
	return fleetrate.Bucket{Prefix: b.Prefix, Key: PauseKey(b.Key), Limits: []fleetrate.Limit{PauseLimit}}
}

// Take is the layout of one take's buckets: the paced buckets at their
// effective limits, then a pause marker for each.
type Take struct {
	Buckets []fleetrate.Bucket
	paced   int
}

// Layout returns the take of the paced buckets (at their effective
// limits) and their pause markers.
func Layout(paced []fleetrate.Bucket) Take {
	tk := Take{paced: len(paced), Buckets: make([]fleetrate.Bucket, 0, 2*len(paced))}
	tk.Buckets = append(tk.Buckets, paced...)
	for _, b := range paced {
		tk.Buckets = append(tk.Buckets, Pause(b))
	}
	return tk
}

// Paced returns the take's paced buckets.
func (tk Take) Paced() []fleetrate.Bucket { return tk.Buckets[:tk.paced] }

// Markers returns the take's pause markers.
func (tk Take) Markers() []fleetrate.Bucket { return tk.Buckets[tk.paced:] }

// Seen is what a take's booking tells of one paced bucket, relative to
// when the booking was made: when its next token is free, and how long
// it is paused.
type Seen struct {
	Next, Pause time.Duration
}

// Read reads a booking of the take (fleetrate.Booking.Debts holds every
// limit's debt after the take, bucket by bucket, in the take's order)
// into what it tells of each paced bucket, or false when the booking does
// not hold the take's debts.
func (tk Take) Read(b fleetrate.Booking) ([]Seen, bool) {
	off := 0
	for _, bk := range tk.Paced() {
		off += len(bk.Limits)
	}
	if len(b.Debts) != off+tk.paced {
		return nil, false
	}
	seen := make([]Seen, tk.paced)
	pos := 0
	for i, bk := range tk.Paced() {
		for _, l := range bk.Limits {
			seen[i].Next = max(seen[i].Next, time.Duration(b.Debts[pos]-(l.Burst-1)*l.Interval()))
			pos++
		}
		seen[i].Pause = State(b.Debts[off+i])
	}
	return seen, true
}

// DrainedSince reports whether a pause marker of the take was drained
// after the take booked bk, given a peek of the markers now (res): a
// drain leaves a marker's debt at least Fill past the drain, while takes
// only move it past their slots (at most MaxMarkedWait ahead) by a
// nanosecond each; so, on the store's clock, a marker whose debt now ends
// past both the booking's time + Fill and what the booking left it was
// drained since.
func (tk Take) DrainedSince(bk fleetrate.Booking, res fleetrate.Result) bool {
	if res.At.IsZero() || bk.Stamp <= 0 || len(bk.Debts) < tk.paced {
		return false
	}
	booked := time.UnixMicro(bk.Stamp)
	left := booked.Add(Fill)
	for _, d := range bk.Debts[len(bk.Debts)-tk.paced:] {
		left = later(left, booked.Add(time.Duration(d)+time.Millisecond))
	}
	return !res.At.Add(res.ResetAfter).Before(left)
}

// Gate returns the spacing gate of an endpoint's bucket: the gate, one
// token per interval of limit, and its hold (bucket#hold), which a late
// answer drains for as long as the gate must stay shut. A request takes
// from both at once.
func Gate(endpoint fleetrate.Bucket, limit fleetrate.Limit) []fleetrate.Bucket {
	return []fleetrate.Bucket{
		{Prefix: endpoint.Prefix, Key: endpoint.Key + "#gate", Limits: []fleetrate.Limit{limit}},
		{Prefix: endpoint.Prefix, Key: endpoint.Key + "#hold", Limits: []fleetrate.Limit{Limit.Named("hold")}},
	}
}

// The climb's markers: on a 429, #rate is drained to ClimbSpan + (the
// climb's start − now), so that ClimbSpan − its state is the time since
// the climb began; #peak to that + (1 − w) × PeakScale, so that the
// difference of the two states, which time does not change, gives w. A
// drain only raises a debt: when processes record climbs at once, the
// markers keep the later start and, most often, the lower w.
const (
	// ClimbSpan outlasts any climb: from the floor back to the documented
	// rate takes at most Recovery × (1 + ∛(1/(floor × (1 − Decrease)))).
	ClimbSpan = 4 * time.Hour
	// PeakScale turns w into a marker state.
	PeakScale = 100 * time.Second
)

// RateMarkers returns bucket b's #rate and #peak markers.
func RateMarkers(b fleetrate.Bucket) (rate, peak fleetrate.Bucket) {
	return fleetrate.Bucket{Prefix: b.Prefix, Key: b.Key + "#rate", Limits: []fleetrate.Limit{Limit}},
		fleetrate.Bucket{Prefix: b.Prefix, Key: b.Key + "#peak", Limits: []fleetrate.Limit{Limit}}
}

// DecodeClimb reads a climb from the states of a bucket's #rate and #peak
// markers, read at now. The two are read one after the other, and both
// states fall with time: a climb with w = 1 (a 429 at the documented rate,
// whose markers hold equal states) reads a #peak state a little below the
// #rate one, which is w = 1 still, not the absence of a climb.
func DecodeClimb(rate, peak time.Duration, now time.Time) ratecontrol.Climb {
	if rate <= 0 {
		return ratecontrol.Climb{}
	}
	w := 1 - float64(peak-rate)/float64(PeakScale)
	return ratecontrol.Climb{W: min(max(w, 0), 1), Start: now.Add(rate - ClimbSpan)}
}

// EncodeClimb returns the drains of the #rate and #peak markers that
// record c, at now.
func EncodeClimb(c ratecontrol.Climb, now time.Time) (rate, peak time.Duration) {
	rate = ClimbSpan + c.Start.Sub(now)
	return rate, rate + time.Duration((1-c.W)*float64(PeakScale))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Known is what one process knows of one bucket's pause: read from the
// bookings of its takes, from announcements, or set by its own 429s.
type Known struct {
	// Until is when the latest pause known ends (local clock).
	Until time.Time
	// At is when this process learned of the latest pause: bookings made
	// before it are void.
	At time.Time
	// Seen is when the pause marker was last read.
	Seen time.Time
	// Longest is how long the fleet's pauses last: the longest chosen by
	// this process without a Retry-After, or left of one it learned of.
	Longest time.Duration
}

// News reports whether a pause until until is news to this process: it
// ends over a second after the one it knows.
func (k *Known) News(until time.Time) bool {
	return until.After(k.Until.Add(time.Second))
}

// Learn records a pause until until, learned at now, and reports whether
// it was news (see News).
func (k *Known) Learn(until, now time.Time) (news bool) {
	if k.News(until) {
		k.At = now
		k.Longest = max(k.Longest, until.Sub(now))
		news = true
	}
	k.Until = later(k.Until, until)
	return news
}

// ReadClimb reads bucket b's climb from its #rate and #peak markers in
// store (two peeks), decoded at now.
func ReadClimb(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket, now func() time.Time) (ratecontrol.Climb, error) {
	var states [2]time.Duration
	rate, peak := RateMarkers(b)
	for i, m := range []fleetrate.Bucket{rate, peak} {
		res, err := store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{m}})
		if err != nil {
			return ratecontrol.Climb{}, err
		}
		states[i] = State(int64(res.ResetAfter))
	}
	return DecodeClimb(states[0], states[1], now()), nil
}

// WriteClimb drains bucket b's #rate and #peak markers in store to record
// climb c at now (see EncodeClimb): one atomic store call, so that no take
// reads a climb half written.
func WriteClimb(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket, c ratecontrol.Climb, now time.Time) error {
	rate, peak := EncodeClimb(c, now)
	rm, pm := RateMarkers(b)
	return store.DrainEach(ctx, []fleetrate.Drain{{Bucket: rm, For: rate}, {Bucket: pm, For: peak}})
}

// Hold holds the take's paced buckets and their pause markers for d, in
// one atomic store call: the markers are drained, so that every take waits
// out the pause, and the buckets start again from the pause's end, empty,
// so that the slots booked before it are void (a void drain).
func Hold(ctx context.Context, store fleetrate.Store, tk Take, d time.Duration) error {
	markers, paced := tk.Markers(), tk.Paced()
	drains := make([]fleetrate.Drain, 0, len(markers)+len(paced))
	for _, m := range markers {
		drains = append(drains, fleetrate.Drain{Bucket: m, For: d})
	}
	for _, b := range paced {
		drains = append(drains, fleetrate.Drain{Bucket: b, For: d, Void: true})
	}
	return store.DrainEach(ctx, drains)
}
