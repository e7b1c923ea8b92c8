package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Defaults of Adaptive.
const (
	// DefaultDecrease multiplies a bucket's effective rate on each 429.
	DefaultDecrease = 0.85
	// DefaultRecovery is how long the effective rate takes to climb back
	// to the rate that drew the last 429 (see Adaptive).
	DefaultRecovery = 90 * time.Second
	// DefaultFloor is the lowest effective rate, as a fraction of the
	// documented rate.
	DefaultFloor = 0.05
)

// ErrPersistentLimit marks a rate limit answered while the bucket's
// effective rate was already at its floor: lowering the pace does not
// clear it, so it needs an operator (a smaller quota, a blocked
// credential). A *GaveUpError at the floor wraps it; the event
// rate_limit_persistent and MetricPersistent count every such answer.
var ErrPersistentLimit = errors.New("transport: still rate limited at the floor rate")

// Adaptive tunes the fleet-wide adaptive pacing. Every 429 (or 503 with
// Retry-After) lowers a bucket's effective rate multiplicatively, and time
// without one raises it back toward the documented rate, never above it.
// The climb is CUBIC's (RFC 9438, as TCP finds a path's capacity): from
// Decrease × w, where w is the rate that drew the 429, the rate rises fast
// at first, flattens as it nears w over Recovery, where the limit was
// found, and then rises ever faster past it, probing for more, up to the
// documented rate. A fleet held back by a hidden limit so spends most of
// its time just under it, and probes it about once per Recovery. A 429
// that comes before the rate is back at w means the limit itself fell:
// the next w is set halfway between the new rate and the old one
// (CUBIC's fast convergence). The climb starts when the 429's pause ends.
// A 429 a few requests after a resume keeps w at what the stretch before
// the pause proved of the limit from below (see limitRange): jitter on a
// strict window, or a limit that fell, which the next such 429 shows.
//
// The rate is kept in the shared store beside the bucket, so every process
// of the fleet paces at the same rate and learns from any one's 429.
type Adaptive struct {
	// Off turns adaptation off for every upstream of the transport; an
	// upstream turns it off for itself with Upstream.Fixed.
	Off bool
	// Decrease multiplies the effective rate on a 429, in (0, 1). The
	// default is DefaultDecrease (0.85).
	Decrease float64
	// Recovery is how long, after a 429's pause, the effective rate takes
	// to climb back to the rate that drew it; between 1 s and 10 minutes.
	// The default is DefaultRecovery (90 s).
	Recovery time.Duration
	// Floor is the lowest effective rate as a fraction of the documented
	// one, in (0, 1). The default is DefaultFloor (0.05).
	Floor float64
	// Refresh is how often a process reads the shared effective rate of a
	// bucket it paces (two peeks). It also reads it at once when told of a
	// change: by an announcement (see Announcer), or by a pause it did not
	// know of; the climb itself is a known curve, so Refresh only catches a
	// change it was not told of. The default is DefaultRateRefresh (30 s).
	Refresh time.Duration
}

// withDefaults fills the zero fields and checks the rest.
func (a Adaptive) withDefaults() (Adaptive, error) {
	if a.Decrease == 0 {
		a.Decrease = DefaultDecrease
	}
	if a.Recovery == 0 {
		a.Recovery = DefaultRecovery
	}
	if a.Floor == 0 {
		a.Floor = DefaultFloor
	}
	if a.Refresh == 0 {
		a.Refresh = DefaultRateRefresh
	}
	switch {
	case !(a.Decrease > 0 && a.Decrease < 1):
		return a, fmt.Errorf("%w: transport: adaptive decrease must be in (0, 1), got %v", fleetrate.ErrInvalid, a.Decrease)
	case a.Recovery < time.Second || a.Recovery > maxRecovery:
		return a, fmt.Errorf("%w: transport: adaptive recovery must be between 1s and %v, got %v", fleetrate.ErrInvalid, maxRecovery, a.Recovery)
	case !(a.Floor > 0 && a.Floor < 1):
		return a, fmt.Errorf("%w: transport: adaptive floor must be in (0, 1), got %v", fleetrate.ErrInvalid, a.Floor)
	case a.Refresh < 0:
		return a, fmt.Errorf("%w: transport: adaptive refresh must not be negative, got %v", fleetrate.ErrInvalid, a.Refresh)
	}
	return a, nil
}

// climb is one bucket's adaptive state: the rate that drew the last 429
// (w, a fraction of the documented rate) and when the climb after it
// began. The zero climb is the documented rate.
type climb struct {
	w     float64
	start time.Time // local clock; zero: no 429 remembered
}

// factor returns the effective rate at now as a fraction of the
// documented rate: CUBIC's window w + c·(t − k)³ with k = Recovery and c
// chosen so that it starts at Decrease × w, between the floor and 1,
// rounded up to a step of 1/128 (so that the limits a take sends, and the
// bucket's conversions, change in steps rather than on every take).
func (a Adaptive) factor(c climb, now time.Time) float64 {
	if c.start.IsZero() {
		return 1
	}
	t := max(now.Sub(c.start).Seconds(), 0)
	k := a.Recovery.Seconds()
	d := (t - k) / k
	f := c.w + c.w*(1-a.Decrease)*d*d*d
	f = math.Ceil(f*128) / 128
	return min(max(f, a.Floor), 1)
}

// lowered returns the climb after a 429 answered at now while the climb
// was c, with the fleet paused until resume and the upstream's limit
// known to lie in [low, high] (see limitRange). The drop is Decrease, or
// half as far when the 429 came within 10 % of the last one's rate, or
// low is within 10 % of the rate (the limit is known: probing it costs
// less). w is the rate that drew the
// 429, or, below a high bound that says more, halfway between the bound
// and the drop × the bound (CUBIC's fast convergence: the climb then
// flattens under the limit rather than over it; near a known limit it
// steps half as far below it), but never below low: a 429 after many
// admitted requests is send jitter on a strict window, or a limit just
// under the rate, and lowering w for it would ratchet the rate down with
// every such 429. The climb starts from the drop × w.
func (a Adaptive) lowered(c climb, now, resume time.Time, low, high float64) climb {
	f := a.factor(c, now)
	drop := a.Decrease
	if !c.start.IsZero() && f >= 0.9*c.w && f <= 1.1*c.w || low >= 0.9*f {
		// Near the rate of the last 429, or after so many admitted
		// requests that the limit lies within 10 % under the rate: the
		// limit is where it was found, so back off half as far.
		drop = 1 - (1-a.Decrease)/2
	}
	// A shallower drop is the same curve begun part of the way up, but
	// never before the last climb began: the markers keep the later start
	// of two (see encodeClimb), so an earlier one would not be recorded.
	ahead := 1 - math.Cbrt((1-drop)/(1-a.Decrease))
	start := later(resume.Add(-time.Duration(ahead*float64(a.Recovery))), c.start)
	w := f
	if high < f {
		w = max(high*(1+drop)/2, low) // low ≤ high (see limitRange)
	}
	// A limit proven above the rate (by the stretch before the last
	// pause: see view.proven) keeps w there: the 429 was jitter, or the
	// limit fell, which the next 429 shows.
	w = min(max(w, low), 1)
	return climb{w: max(w, a.Floor), start: start}
}

// hiddenBurst is the largest burst limitRange assumes of an upstream's
// limit when it reads how far below the fleet's rate the limit can lie.
// A limit with a larger burst is still found, in more steps (each 429
// lowers the rate by Decrease at least).
const hiddenBurst = 4

// limitRange reads what a 429 on a request sent at sent tells of the
// upstream's limit, when the fleet resumed from its last pause at resumed
// and has since paced at rate (requests per second; f of the documented
// rate). The fleet sent k = rate × (sent − resumed) requests in between,
// and the upstream admitted the k − 1 before this one. A token bucket
// that held at least one token at the resume (it refilled during the
// pause) and admits them at h per second with a burst of b ≥ 1 has
// b + h·k/rate < k, so h < rate × (1 − 1/k): the high bound it returns,
// as a fraction of the documented rate. One that admitted the k − 1 with
// b ≤ hiddenBurst has b + h·(k − 1)/rate ≥ k − 1, so h ≥ rate × (1 −
// hiddenBurst/(k − 1)): the low bound (0 when that is negative), close
// to the rate after many requests, and never above the high one. Before the second request's slot (k <
// 2) the 429 says the pause was too short, not the rate too high: soon.
// Without a resume to count from it returns 0 and f.
func limitRange(f, rate float64, sent, resumed time.Time) (low, high float64, soon bool) {
	if resumed.IsZero() || !resumed.Before(sent) {
		return 0, f, false
	}
	k := rate * sent.Sub(resumed).Seconds()
	if k < 2 {
		return 0, f, true
	}
	return max(f*(1-hiddenBurst/(k-1)), 0), f * (1 - 1/k), false
}

// paceRate returns the rate a bucket paces requests at over a second or
// more: its slowest limit's.
func paceRate(b fleetrate.Bucket) float64 {
	r := math.Inf(1)
	for _, l := range b.Limits {
		r = min(r, l.Rate)
	}
	return r
}

// maxSoon is how many 429s in a row a bucket takes as a pause too short
// (see limitRange) before it lowers the rate all the same: an upstream
// that limits every request lowers it to the floor, and is reported.
// "In a row" is for this process: an answer other than a rate limit ends
// the row (see admitted), and so does a decrease by any process.
const maxSoon = 2

// admitted records an answer to a request of tg that was not a rate
// limit: the 429s after it start a new row (see maxSoon).
func (t *Transport) admitted(tg Target) {
	if t.views.inRow.Load() == 0 {
		return // no row to end: the common case costs one atomic load
	}
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	for _, name := range tg.drained() {
		if v := t.views.m[name]; v != nil {
			t.views.setSoon(v, 0)
		}
	}
}

// The markers kept beside a paced bucket in the shared store. A marker is
// a bucket of its own whose debt carries the state: a token per
// nanosecond and a burst of 2^40, so it fills in markerFill (about 18
// minutes), and a drain for d leaves a debt of d + markerFill that decays
// with time like any debt. What lies beyond markerFill is the state; a
// take adds a nanosecond, and its booked wait, far below markerFill.
//
//   - bucket#pause, the pause: drained for the pause on a 429. Every take
//     of the bucket also takes from it, in the same atomic call: a take
//     while it is drained waits out the pause (the fleet queues behind it,
//     booked in order, no polling), and otherwise it never delays one.
//     The take's Booking reports its debt: every process learns a pause
//     from its next take, at no extra call.
//   - bucket#rate and bucket#peak, the climb: on a 429, #rate is drained
//     to climbSpan + (the climb's start − now), so that climbSpan − its
//     state is the time since the climb began; #peak to that + (1 − w) ×
//     peakScale, so that the difference of the two states, which time
//     does not change, gives w. A drain only raises a debt: when processes
//     record climbs at once, the markers keep the later start and, most
//     often, the lower w. A peek reads each, at most every Refresh per
//     process and bucket.
var (
	markerLimit = fleetrate.Limit{Name: "marker", Rate: 1e9, Burst: 1 << 40}
	markerFill  = markerLimit.FillTime()
)

const (
	// climbSpan outlasts any climb: from the floor back to the documented
	// rate takes at most Recovery × (1 + ∛(1/(floor × (1 − Decrease)))).
	climbSpan = 4 * time.Hour
	// peakScale turns w into a marker state.
	peakScale = 100 * time.Second
)

// DefaultRateRefresh is the default of Adaptive.Refresh.
const DefaultRateRefresh = 30 * time.Second

// maxRecovery keeps every climb within climbSpan.
const maxRecovery = 10 * time.Minute

// maxMarkedWait is the longest wait a take may book with its pause
// markers: a booked wait pushes a marker's debt to it, which must stay
// below markerFill to be told from a pause.
const maxMarkedWait = 10 * time.Minute

func pauseMarker(b fleetrate.Bucket) fleetrate.Bucket {
	return fleetrate.Bucket{Prefix: b.Prefix, Key: PauseBucket(b.Key), Limits: []fleetrate.Limit{PauseLimit}}
}

func rateMarker(b fleetrate.Bucket) fleetrate.Bucket {
	return fleetrate.Bucket{Prefix: b.Prefix, Key: b.Key + "#rate", Limits: []fleetrate.Limit{markerLimit}}
}

func peakMarker(b fleetrate.Bucket) fleetrate.Bucket {
	return fleetrate.Bucket{Prefix: b.Prefix, Key: b.Key + "#peak", Limits: []fleetrate.Limit{markerLimit}}
}

// state returns a marker's state from its debt.
func state(debt int64) time.Duration {
	return max(time.Duration(debt)-markerFill, 0)
}

// decodeClimb reads a climb from the states of a bucket's #rate and #peak
// markers, read at now. The two are read one after the other, and both
// states fall with time: a climb with w = 1 (a 429 at the documented rate,
// whose markers hold equal states) reads a #peak state a little below the
// #rate one, which is w = 1 still, not the absence of a climb.
func decodeClimb(rate, peak time.Duration, now time.Time) climb {
	if rate <= 0 {
		return climb{}
	}
	w := 1 - float64(peak-rate)/float64(peakScale)
	return climb{w: min(max(w, 0), 1), start: now.Add(rate - climbSpan)}
}

// encodeClimb returns the drains of the #rate and #peak markers that
// record c, at now.
func encodeClimb(c climb, now time.Time) (rate, peak time.Duration) {
	rate = climbSpan + c.start.Sub(now)
	return rate, rate + time.Duration((1-c.w)*float64(peakScale))
}

// view is what this process knows of one bucket's markers, read from the
// bookings of its takes, from announcements or set by its own 429s.
type view struct {
	pauseUntil time.Time // local clock
	// pauseAt is when this process learned of the latest pause: bookings
	// made before it are void (see Transport.drain).
	pauseAt   time.Time
	climb     climb
	read      time.Time // when the climb was last read from the store
	seen      time.Time // when the pause marker was last read
	decreased time.Time // when this process last lowered the rate
	floored   time.Time // when it lowered it to the floor, if it did
	// lastPause is how long the fleet's pauses last: the longest chosen by
	// this process without a Retry-After, or left of one it learned of.
	lastPause time.Duration
	// soon counts the 429s in a row taken as a pause too short.
	soon int
	// sent is when this process last let a request of the bucket go,
	// began when it let its first go, and sends how many it let go.
	sent, began time.Time
	sends       int
	// proven is the least the upstream's limit was shown to be, as a
	// fraction of the documented rate, by the fleet's requests between its
	// last two pauses (or from this process's first request to its first
	// pause): the low bound of limitRange, 0 when that stretch was short.
	// A 429 soon after a resume says little of the limit from below, and
	// jitter on a strict window (a request late on the wire, the next on
	// time) would otherwise cut the rate to what the few requests since
	// the resume allow; the proof is used for that one 429 (see lower).
	proven float64
	// rtt and gateRTT are the quickest recent answer of an endpoint with a
	// spacing gate, and the quickest recent take of its gate (see
	// Transport.answered).
	rtt, gateRTT rttFloor
	// next is when the bucket's next token was free, as the last booking
	// this process made left it (local clock): a request whose wait budget
	// ends sooner fails with backpressure without asking the store.
	next time.Time
}

// views holds the views of a transport's buckets.
type views struct {
	mu sync.Mutex
	m  map[string]*view
	// inRow counts the views whose soon is above zero, so that an
	// admitted request, when none is, costs no lock (see admitted).
	inRow atomic.Int32
}

// setSoon sets v.soon to n, keeping inRow. vs.mu is held.
func (vs *views) setSoon(v *view, n int) {
	switch {
	case v.soon == 0 && n > 0:
		vs.inRow.Add(1)
	case v.soon > 0 && n == 0:
		vs.inRow.Add(-1)
	}
	v.soon = n
}

func (vs *views) get(key string) *view {
	if vs.m == nil {
		vs.m = map[string]*view{}
	}
	v := vs.m[key]
	if v == nil {
		v = &view{}
		vs.m[key] = v
	}
	return v
}

// scaled returns the limits with their rates multiplied by f, or the
// limits themselves when f is 1 or a scaled limit would not be valid.
func scaled(limits []fleetrate.Limit, f float64) []fleetrate.Limit {
	if f >= 1 {
		return limits
	}
	out := make([]fleetrate.Limit, len(limits))
	for i, l := range limits {
		out[i] = fleetrate.Limit{Name: l.Name, Rate: l.Rate * f, Burst: l.Burst}
		if out[i].Validate() != nil {
			return limits
		}
	}
	return out
}

// take is the layout of one take's buckets: the paced buckets at their
// effective limits, then a pause marker for each.
type take struct {
	buckets []fleetrate.Bucket
	paced   int
}

// layout returns the take of the paced buckets at their effective rates.
// When this process's copy of a bucket's climb is older than
// Adaptive.Refresh (or an announcement or an unknown pause said it
// changed), it reads the climbs first (see readClimbs).
func (t *Transport) layout(ctx context.Context, tg Target, paced []fleetrate.Bucket) take {
	adaptive := !t.adaptive.Off && !tg.Fixed
	if adaptive {
		t.readClimbs(ctx, paced)
	}
	now := time.Now()
	tk := take{paced: len(paced), buckets: make([]fleetrate.Bucket, 0, 2*len(paced))}
	t.views.mu.Lock()
	for _, b := range paced {
		if adaptive {
			b.Limits = scaled(b.Limits, t.adaptive.factor(t.views.get(b.Key).climb, now))
			t.m.effectiveRate(tg, b.Key, b.Limits)
		}
		tk.buckets = append(tk.buckets, b)
	}
	t.views.mu.Unlock()
	for _, b := range paced {
		tk.buckets = append(tk.buckets, pauseMarker(b))
	}
	return tk
}

// readClimbs reads the climbs of the paced buckets whose copy is stale, in
// two peeks for each; a failed read keeps the copies.
func (t *Transport) readClimbs(ctx context.Context, paced []fleetrate.Bucket) {
	now := time.Now()
	var stale []fleetrate.Bucket
	t.views.mu.Lock()
	for _, b := range paced {
		if now.Sub(t.views.get(b.Key).read) >= t.adaptive.Refresh {
			stale = append(stale, b)
		}
	}
	t.views.mu.Unlock()
	if len(stale) == 0 {
		return
	}
	climbs := make([]climb, len(stale))
	for i, b := range stale {
		c, err := readClimb(ctx, t.lim.Store(), b)
		if err != nil {
			return
		}
		climbs[i] = c
	}
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	for i, b := range stale {
		v := t.views.get(b.Key)
		v.read = now
		if climbs[i].start.After(v.climb.start) {
			// Another process lowered the rate: its 429 ends this
			// process's row of 429s blamed on pauses (see maxSoon).
			t.views.setSoon(v, 0)
		}
		if now.Sub(v.decreased) > t.adaptive.Refresh || climbs[i].start.After(v.climb.start) {
			// The store's climb, unless this process lowered the rate
			// itself since it was read.
			v.climb = climbs[i]
		}
	}
}

// readClimb reads bucket b's climb from its #rate and #peak markers: two
// peeks.
func readClimb(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket) (climb, error) {
	var states [2]time.Duration
	for i, m := range []fleetrate.Bucket{rateMarker(b), peakMarker(b)} {
		res, err := store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{m}})
		if err != nil {
			return climb{}, err
		}
		states[i] = state(int64(res.ResetAfter))
	}
	return decodeClimb(states[0], states[1], time.Now()), nil
}

// paused records a pause of the bucket until until, and reports whether
// this process did not know of it: a 429 elsewhere, which may also have
// lowered the rate, so the climb is read again before the next take. The
// pause is also the least this process pauses for a 429 of its own
// without a Retry-After (see Transport.pauseFor): the fleet's last pause.
// t.views.mu is held.
func (v *view) paused(until time.Time) (unknown bool) {
	if v.unknownPause(until) {
		now := time.Now()
		v.read = time.Time{}
		v.pauseAt = now
		v.lastPause = max(v.lastPause, until.Sub(now))
		unknown = true
	}
	v.pauseUntil = later(v.pauseUntil, until)
	return unknown
}

// unknownPause reports whether a pause until until is news to this
// process: it ends over a second after the one it knows.
func (v *view) unknownPause(until time.Time) bool {
	return until.After(v.pauseUntil.Add(time.Second))
}

// learnPause records a pause of bucket key until until, learned from the
// store or an announcement, in its view v: v.paused, after endStretch when
// the pause is news (a 429 elsewhere ended the stretch, after this process
// last saw no pause). t.views.mu is held.
func (t *Transport) learnPause(v *view, key string, until time.Time) (unknown bool) {
	if v.unknownPause(until) {
		if b, err := t.lim.Bucket(key); err == nil {
			t.endStretch(v, paceRate(b), v.seen)
		}
	}
	return v.paused(until)
}

// stretchFrom returns when the fleet's stretch of requests that a 429
// ends began: at resumed, the end of the last pause, or, with none known,
// at this process's first request (zero if it sent none).
func (v *view) stretchFrom(resumed time.Time) time.Time {
	if resumed.IsZero() {
		return v.began
	}
	return resumed
}

// endStretch records in v.proven what the fleet's requests since its last
// pause ended (or since this process's first request) prove of the
// upstream's limit, for a pause that began after end, the fleet pacing
// until then at its effective rate: the climb's factor of documented (the
// bucket's pace, requests per second). A stretch that ended at once after
// a pause (the pause was too short) or during it proves nothing new and
// keeps the last proof. t.views.mu is held.
func (t *Transport) endStretch(v *view, documented float64, end time.Time) {
	since := v.stretchFrom(v.pauseUntil)
	if since.IsZero() || !since.Before(end) {
		return
	}
	f := t.adaptive.factor(v.climb, end)
	low, _, soon := limitRange(f, f*documented, end, since)
	if !soon {
		v.proven = low
	}
}

// learn reads a take's booking, which holds every limit's debt after the
// take, bucket by bucket, in the take's layout: when each bucket's next
// token is free, and how long its pause lasts. It reports whether the take
// found a pause this process did not know of.
func (t *Transport) learn(tk take, b fleetrate.Booking, at time.Time) (unknownPause bool) {
	off := 0
	for _, bk := range tk.buckets[:tk.paced] {
		off += len(bk.Limits)
	}
	if len(b.Debts) != off+tk.paced {
		return false
	}
	unknown := false
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	pos := 0
	for _, bk := range tk.buckets[:tk.paced] {
		var next time.Duration
		for _, l := range bk.Limits {
			next = max(next, time.Duration(b.Debts[pos]-(l.Burst-1)*l.Interval()))
			pos++
		}
		v := t.views.get(bk.Key)
		v.next = at.Add(next)
		if pause := state(b.Debts[off]); pause > 0 && t.learnPause(v, bk.Key, at.Add(pause)) {
			unknown = true
		}
		v.seen = at
		off++
	}
	return unknown
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// learnNext records when the bucket's next token is free, from a denial.
func (t *Transport) learnNext(key string, next time.Time) {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	v := t.views.get(key)
	v.next = later(v.next, next)
}

// nextFree returns when the first of the buckets' next tokens is free, as
// far as this process's last bookings tell.
func (t *Transport) nextFree(paced []fleetrate.Bucket) time.Time {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	var next time.Time
	for _, b := range paced {
		next = later(next, t.views.get(b.Key).next)
	}
	return next
}

// pausedUntil returns the latest pause this process knows of the buckets,
// and whether it has read their pause markers since since.
func (t *Transport) pausedUntil(paced []fleetrate.Bucket, since time.Time) (until time.Time, fresh bool) {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	fresh = true
	for _, bk := range paced {
		v := t.views.get(bk.Key)
		until = later(until, v.pauseUntil)
		if v.seen.Before(since) {
			fresh = false
		}
	}
	return until, fresh
}

// pauseLocally stops this process's requests to the buckets until until,
// at once, before the drain that tells the rest of the fleet returns. It
// returns when each bucket's previous pause ended (zero: none known).
func (t *Transport) pauseLocally(keys []string, until time.Time) (resumed []time.Time) {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	now := time.Now()
	resumed = make([]time.Time, len(keys))
	for i, k := range keys {
		v := t.views.get(k)
		resumed[i] = v.pauseUntil
		v.pauseUntil = later(v.pauseUntil, until)
		v.pauseAt = now
	}
	return resumed
}

// pausedSince reports whether this process learned of a pause of one of
// the buckets after at.
func (t *Transport) pausedSince(paced []fleetrate.Bucket, at time.Time) bool {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	for _, b := range paced {
		if t.views.get(b.Key).pauseAt.After(at) {
			return true
		}
	}
	return false
}

// decrease lowers the effective rate of the buckets the 429 lim concerns,
// fleet-wide, by recording a new climb in their markers, to begin when
// the pause ends at resume; resumed holds when each
// bucket's previous pause ended. A request sent before this process last
// lowered the rate reports what the lowered rate has already answered, so
// it lowers nothing more. It reports whether a bucket was already at its
// floor.
func (t *Transport) decrease(ctx context.Context, tg Target, buckets []fleetrate.Bucket, lim limited, resume time.Time, resumed []time.Time, attrs []slog.Attr) (atFloor bool) {
	if t.adaptive.Off || tg.Fixed {
		return false
	}
	now := time.Now()
	var changes []rateChange
	t.views.mu.Lock()
	for i, b := range buckets {
		ch, floor, ok := t.lower(t.views.get(b.Key), b, now, lim.sent, resume, resumed[i], lim.soon)
		atFloor = atFloor || floor
		if ok {
			changes = append(changes, ch)
		}
	}
	t.views.mu.Unlock()
	for _, ch := range changes {
		rate, peak := encodeClimb(ch.c, now)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		store := t.lim.Store()
		err := store.Drain(dctx, []fleetrate.Bucket{rateMarker(ch.b)}, rate)
		if err == nil {
			err = store.Drain(dctx, []fleetrate.Bucket{peakMarker(ch.b)}, peak)
		}
		cancel()
		t.announceRate(ctx, ch.b)
		t.log.LogAttrs(ctx, slog.LevelWarn, "rate_adapted", append(attrs,
			slog.String("bucket", ch.b.Key),
			slog.Float64("from", ch.from), slog.Float64("to", ch.at),
			slog.Float64("peak", ch.c.w),
			slog.Float64("rate", ch.at*ch.b.Limits[0].Rate),
			slog.Any("error", err))...)
	}
	if atFloor {
		t.m.persistent(tg)
		t.log.LogAttrs(ctx, slog.LevelError, "rate_limit_persistent", append(attrs,
			slog.Float64("floor", t.adaptive.Floor))...)
	}
	return atFloor
}

// rateChange is a climb decrease recorded for bucket b.
type rateChange struct {
	b        fleetrate.Bucket
	c        climb
	from, at float64 // the effective rates, as fractions
}

// lower decides the new climb of bucket b (this process's view v) for a
// 429 answered at now on a request sent at sent, the fleet paused until
// resume and its previous pause over at resumed (zero when it knows of
// none: then the lower bound counts from its first request), soon when the
// 429 came at once after that pause (see Transport.limitedAtOnce): ok when the rate is
// to be lowered, and floor when the rate was at its floor already.
// t.views.mu is held.
func (t *Transport) lower(v *view, b fleetrate.Bucket, now, sent, resume, resumed time.Time, soon bool) (ch rateChange, floor, ok bool) {
	from := t.adaptive.factor(v.climb, now)
	// With no pause yet, the fleet has sent at its rate at least since
	// this process's first request, so a first 429 after hundreds of
	// admitted ones bounds the limit from below as closely as one after a
	// pause. Not from above: the upstream's bucket need not have been
	// full at the start (another client, the fleet's last run).
	low, high, _ := limitRange(from, from*paceRate(b), sent, v.stretchFrom(resumed))
	if resumed.IsZero() {
		high = from
	}
	// What the stretch before the last pause proved holds unless this
	// 429 shows the limit fell: the next one, after a short stretch
	// again, does (this stretch's proof replaces it below).
	proven := max(low, v.proven)
	c := t.adaptive.lowered(v.climb, now, resume, proven, max(high, proven))
	to := t.adaptive.factor(c, resume)
	if to == t.adaptive.Floor && !v.floored.IsZero() && sent.After(v.floored) {
		// Sent after a 429 had brought the rate to its floor, and
		// limited all the same: lowering it further would not help.
		floor = true
	}
	if sent.Before(v.decreased) || sent.Before(v.climb.start) {
		// Sent before the fleet's last 429 lowered the rate (or during
		// its pause): the lowered rate has answered it already.
		return ch, floor, false
	}
	if soon && v.soon < maxSoon {
		// Limited at once after a pause: the pause was too short (the
		// next one is longer; see pauseFor), the rate is not to blame.
		t.views.setSoon(v, v.soon+1)
		return ch, floor, false
	}
	t.views.setSoon(v, 0)
	switch {
	case to > t.adaptive.Floor:
		v.floored = time.Time{} // climbed off the floor since
	case v.floored.IsZero():
		v.floored = now
	}
	// This process wrote the climb: no need to read it back (the drain
	// that follows would otherwise peek it).
	v.climb, v.decreased, v.read = c, now, now
	v.proven = low
	return rateChange{b: b, c: c, from: from, at: to}, floor, true
}

// EffectiveFactor reads from store the effective rate of bucket b (a
// transport's endpoint or credential bucket, as Limiter.Bucket returns it)
// as a fraction of its documented rate, under the adaptive settings a (its
// zero value means the defaults): what every transport pacing b reads, for
// a status page or a tool. It is 1 when no 429 has lowered the rate.
func EffectiveFactor(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket, a Adaptive) (float64, error) {
	a, err := a.withDefaults()
	if err != nil {
		return 0, err
	}
	c, err := readClimb(ctx, store, b)
	if err != nil {
		return 0, err
	}
	return a.factor(c, time.Now()), nil
}

// SetEffectiveFactor makes f (a fraction of the documented rate, in
// [Floor, 1]) the effective rate of bucket b in store now, for every
// transport pacing b under the adaptive settings a (its zero value means
// the defaults): the climb back then starts from f, as after a 429 that
// found the limit at f / Decrease. It replaces what 429s recorded. It is
// for operators and tests; transports call nothing like it. Each process
// sees the new rate when it next reads the climb (within a.Refresh).
func SetEffectiveFactor(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket, a Adaptive, f float64) error {
	a, err := a.withDefaults()
	if err != nil {
		return err
	}
	if !(f >= a.Floor && f <= 1) {
		return fmt.Errorf("%w: transport: effective factor must be between the floor %v and 1, got %v", fleetrate.ErrInvalid, a.Floor, f)
	}
	rm, pm := rateMarker(b), peakMarker(b)
	if err := store.Reset(ctx, rm.StoreKey(), pm.StoreKey()); err != nil {
		return err
	}
	if f == 1 {
		return nil
	}
	now := time.Now()
	c := climb{w: f / a.Decrease, start: now}
	if c.w > 1 {
		// Above Decrease: part of the way up the climb back to 1, where
		// w + w(1 − Decrease)((t − k)/k)³ = f.
		d := -math.Cbrt((1 - f) / (1 - a.Decrease))
		c = climb{w: 1, start: now.Add(-time.Duration((1 + d) * float64(a.Recovery)))}
	}
	rate, peak := encodeClimb(c, now)
	if err := store.Drain(ctx, []fleetrate.Bucket{rm}, rate); err != nil {
		return err
	}
	return store.Drain(ctx, []fleetrate.Bucket{pm}, peak)
}

// lateSlack is how late after its slot a request may go out as booked:
// the send jitter a limit of burst 1 is assumed to absorb. A probe of the
// workers' wake-up lateness at load 4 read 0.6 ms at p50, 1.2 ms at p90,
// 10 ms at p95 and 25 ms at p99 (docs/BENCHMARKS.md, "late requests").
// Less would serve a strict window better, but every request booked
// again loses its slot: at 2 ms the documented 20/s burst-2 upstream,
// whose burst absorbs the lateness, booked 9 of its 1,140 requests a
// minute again (94.5 % of its limit instead of 95 %), at 5 ms one, and at
// 1.3 ms for every request 18 (docs/OPERATIONS.md), while the strict
// window's 429s, which come from jitter after the check, did not fall.
// A process's first requests are the exception (see coldSends).
const lateSlack = 5 * time.Millisecond

// coldSends is how many of a bucket's first requests in a process go out
// as booked only within coldSlack of their slot at burst 1, instead of
// lateSlack: a process's first requests run code for the first time and
// open the upstream's connections, and they went out 3 ms late in most
// of the outbound benchmark's strict runs, on the fleet's first slots,
// where the next slot's request then drew a 429 (and its 2 s pause) from
// a strict window. Booking them again costs a few slots once per process.
const coldSends = 4

// coldSlack returns how late a cold request (see coldSends) of a burst-1
// limit l may go out as booked: half the margin a fleet paced at 95 % of
// a strict window has (an interval / 40), at least a millisecond (a
// timer's lateness) and at most lateSlack.
func coldSlack(l fleetrate.Limit) time.Duration {
	return min(max(time.Duration(l.Interval())/40, time.Millisecond), lateSlack)
}

// spread decides when a request whose slot began at due goes out, against
// the requests of this process that went out before it. On time (within
// lateSlack; coldSlack for a process's first requests at burst 1), at once. A request may go out late only as far as its
// buckets' bursts allow: with burst b, an interval is 1/rate and a slot
// (b − 1) intervals + lateSlack late still keeps every window of the
// upstream within b + rate × the window, whoever holds the next slots. So
// a late request keeps one interval of its buckets' fastest limits after
// the last one this process sent (so that the overdue requests of a
// process that stalled go out spaced as booked rather than together), and
// one later than its buckets tolerate is void: booked again, so that the
// upstream never sees two requests closer than the limit allows because
// a process woke late. now is the time it would go out. It returns how
// long to wait first, or void.
func (t *Transport) spread(tk take, due, now time.Time) (wait time.Duration, void bool) {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	cold := false
	for _, b := range tk.buckets[:tk.paced] {
		cold = cold || t.views.get(b.Key).sends < coldSends
	}
	gap, tolerance, onTime := spacing(tk.buckets[:tk.paced], cold)
	late := now.Sub(due)
	at := now
	if late > onTime {
		for _, b := range tk.buckets[:tk.paced] {
			at = later(at, t.views.get(b.Key).sent.Add(gap))
		}
		if at.Sub(due) > tolerance {
			return 0, true
		}
	}
	for _, b := range tk.buckets[:tk.paced] {
		v := t.views.get(b.Key)
		v.sent = later(v.sent, at)
		if v.began.IsZero() {
			v.began = at
		}
		v.sends++
	}
	return at.Sub(now), false
}

// maxSpin bounds how long before its slot a request of a burst-1 bucket
// wakes to wait out the rest without a timer (see waiter.sleepUntil).
const maxSpin = 1500 * time.Microsecond

// spinLead returns how long before its slot a request of the paced buckets
// wakes to wait out the rest without a timer: when a limit of theirs has
// burst 1 (its slots tolerate lateSlack, no more), maxSpin or an eighth
// of the limit's interval, whichever is less, so that a fast bucket spends
// at most an eighth of a processor on it; otherwise 0 (a burst absorbs a
// timer's lateness).
func spinLead(paced []fleetrate.Bucket) time.Duration {
	var lead time.Duration
	for _, b := range paced {
		for _, l := range b.Limits {
			if l.Burst == 1 {
				lead = max(lead, min(maxSpin, time.Duration(l.Interval())/8))
			}
		}
	}
	return lead
}

// spacing returns the interval of the buckets' fastest limits, how late
// after its slot a request of them may go out (the least, over their
// limits, of (burst − 1) intervals + lateSlack, or for a cold request
// and burst 1, coldSlack), and how late it may go out as booked,
// unspaced: lateSlack, or a cold request's least coldSlack.
func spacing(paced []fleetrate.Bucket, cold bool) (gap, tolerance, onTime time.Duration) {
	tolerance, onTime = time.Duration(1<<63-1), lateSlack
	for _, b := range paced {
		d := time.Duration(1<<63 - 1)
		for _, l := range b.Limits {
			iv := time.Duration(l.Interval())
			d = min(d, iv)
			slack := lateSlack
			if cold && l.Burst == 1 {
				slack = coldSlack(l)
			}
			tolerance = min(tolerance, time.Duration(l.Burst-1)*iv+slack)
			onTime = min(onTime, slack)
		}
		gap = max(gap, d)
	}
	return gap, tolerance, onTime
}
