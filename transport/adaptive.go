package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Defaults of Adaptive.
const (
	// DefaultDecrease multiplies a bucket's effective rate on each 429.
	DefaultDecrease = 0.8
	// DefaultRecovery is how long the effective rate takes to climb back
	// from zero to the documented rate without a 429: it rises by the
	// documented rate × elapsed / DefaultRecovery, an additive increase.
	DefaultRecovery = 5 * time.Minute
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

// Adaptive tunes the fleet-wide adaptive pacing: every 429 (or 503 with
// Retry-After) lowers a bucket's effective rate multiplicatively, and time
// without one raises it additively back toward the documented rate, never
// above it (AIMD, as TCP finds a path's capacity). The effective rate is
// kept in the shared store beside the bucket, so every process of the fleet
// paces at the same rate and learns from any one's 429.
type Adaptive struct {
	// Off turns adaptation off for every upstream of the transport; an
	// upstream turns it off for itself with Upstream.Fixed.
	Off bool
	// Decrease multiplies the effective rate on a 429, in (0, 1). The
	// default is DefaultDecrease (0.8).
	Decrease float64
	// Recovery is the time the effective rate takes to climb from zero
	// back to the documented rate. The default is DefaultRecovery (5 min).
	Recovery time.Duration
	// Floor is the lowest effective rate as a fraction of the documented
	// one, in (0, 1). The default is DefaultFloor (0.05).
	Floor float64
	// Refresh is how often a process reads the shared effective rate of a
	// bucket it paces (one peek). The default is DefaultRateRefresh (2 s).
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

// The markers kept beside a paced bucket in the shared store. A marker is
// a bucket of its own whose debt carries the state: a token per
// nanosecond and a burst of 2^40, so it fills in markerFill (about 18
// minutes), and a drain for d leaves a debt of d + markerFill that decays
// with time like any debt. What lies beyond markerFill is the state:
//
//   - bucket#pause, the pause: drained for the pause on a 429. Every take
//     of the bucket also takes from it, in the same atomic call: a take
//     while it is drained waits out the pause (the fleet queues behind it,
//     booked in order, no polling), and otherwise it never delays one (a
//     take adds a nanosecond, and its booked wait, far below markerFill).
//     The take's Booking reports its debt: every process learns a pause
//     from its next take, at no extra call.
//   - bucket#rate, the penalty P: drained to P on a 429 (a drain only ever
//     raises it, so processes that lower the rate together agree) and
//     decaying by the elapsed time, so that the effective rate
//     1 − P/Recovery (of the documented rate) climbs back linearly. It is
//     read with a peek at most every RateRefresh per process and bucket.
var (
	markerLimit = fleetrate.Limit{Name: "marker", Rate: 1e9, Burst: 1 << 40}
	markerFill  = markerLimit.FillTime()
)

// DefaultRateRefresh is the default of Adaptive.Refresh.
const DefaultRateRefresh = 2 * time.Second

// maxRecovery keeps every penalty far below a marker's fill time.
const maxRecovery = time.Hour

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

// view is what this process knows of one bucket's markers, read from the
// bookings of its takes (or set by its own 429s).
type view struct {
	pauseUntil time.Time // local clock
	penalty    time.Duration
	penaltyAt  time.Time     // when penalty was read or set (local clock)
	read       time.Time     // when the penalty marker was last read
	seen       time.Time     // when the markers were last read
	decreased  time.Time     // when this process last lowered the rate
	floored    time.Time     // when it lowered it to the floor, if it did
	lastPause  time.Duration // the last pause chosen without a Retry-After
	// next is when the bucket's next token was free, as the last booking
	// this process made left it (local clock): a request whose wait budget
	// ends sooner fails with backpressure without asking the store.
	next time.Time
}

// views holds the views of a transport's buckets.
type views struct {
	mu sync.Mutex
	m  map[string]*view
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

// penaltyNow returns v's penalty decayed to now.
func (v *view) penaltyNow(now time.Time) time.Duration {
	return max(v.penalty-now.Sub(v.penaltyAt), 0)
}

// factor returns the effective rate of the bucket as a fraction of its
// documented rate, rounded up to a step of 1/128 (so that the limits a take
// sends, and the bucket's conversions, change in steps rather than on
// every take, and the nanosecond each take adds to the penalty marker
// changes nothing).
func (a Adaptive) factor(penalty time.Duration) float64 {
	f := 1 - float64(penalty)/float64(a.Recovery)
	f = math.Ceil(f*128) / 128
	return min(max(f, a.Floor), 1)
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

// learn reads a take's booking: the booking holds every limit's debt
// after the take, bucket by bucket (the paced buckets, at the limits the
// take used, then their pause markers, one for each). From the debts it
// learns when each bucket's next token is free and how long its pause
// lasts.
func (t *Transport) learn(used []fleetrate.Bucket, b fleetrate.Booking, at time.Time) {
	paced := used[:len(used)/2]
	off := 0
	for _, bk := range paced {
		off += len(bk.Limits)
	}
	if len(b.Debts) != off+len(paced) {
		return
	}
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	pos := 0
	for _, bk := range paced {
		var next time.Duration
		for _, l := range bk.Limits {
			next = max(next, time.Duration(b.Debts[pos]-(l.Burst-1)*l.Interval()))
			pos++
		}
		t.views.get(bk.Key).next = at.Add(next)
	}
	for i, bk := range paced {
		v := t.views.get(bk.Key)
		if pause := time.Duration(b.Debts[off+i]) - markerFill; pause > 0 {
			if until := at.Add(pause); until.After(v.pauseUntil.Add(time.Second)) {
				// A pause this process did not know: a 429 elsewhere, which
				// also lowered the rate. Read the rate before the next take.
				v.read = time.Time{}
			}
			if until := at.Add(pause); until.After(v.pauseUntil) {
				v.pauseUntil = until
			}
		}
		v.seen = at
	}
}

// learnNext records when the bucket's next token is free, from a denial.
func (t *Transport) learnNext(key string, next time.Time) {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	if v := t.views.get(key); next.After(v.next) {
		v.next = next
	}
}

// nextFree returns when the first of the buckets' next tokens is free, as
// far as this process's last bookings tell.
func (t *Transport) nextFree(paced []fleetrate.Bucket) time.Time {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	var next time.Time
	for _, b := range paced {
		if n := t.views.get(b.Key).next; n.After(next) {
			next = n
		}
	}
	return next
}

// pausedUntil returns the latest pause this process knows of the buckets,
// and whether it has read their markers since since.
func (t *Transport) pausedUntil(paced []fleetrate.Bucket, since time.Time) (until time.Time, fresh bool) {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	fresh = true
	for _, bk := range paced {
		v := t.views.get(bk.Key)
		if v.pauseUntil.After(until) {
			until = v.pauseUntil
		}
		if v.seen.Before(since) {
			fresh = false
		}
	}
	return until, fresh
}

// pauseLocally stops this process's requests to the buckets until until,
// at once, before the drain that tells the rest of the fleet returns.
func (t *Transport) pauseLocally(keys []string, until time.Time) {
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	for _, k := range keys {
		if v := t.views.get(k); until.After(v.pauseUntil) {
			v.pauseUntil = until
		}
	}
}

// effective returns the paced buckets with their adapted limits, reading
// the shared penalties first when this process's copy is older than
// Adaptive.Refresh (one peek per bucket; a failed read keeps the copy).
func (t *Transport) effective(ctx context.Context, tg Target, paced []fleetrate.Bucket) []fleetrate.Bucket {
	if t.adaptive.Off || tg.Fixed {
		return paced
	}
	now := time.Now()
	for _, b := range paced {
		t.views.mu.Lock()
		stale := now.Sub(t.views.get(b.Key).read) >= t.adaptive.Refresh
		t.views.mu.Unlock()
		if !stale {
			continue
		}
		res, err := t.lim.Store().Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{rateMarker(b)}})
		if err != nil {
			continue
		}
		t.views.mu.Lock()
		v := t.views.get(b.Key)
		v.read = now
		if p := max(res.ResetAfter-markerFill, 0); p > v.penaltyNow(now) || now.Sub(v.decreased) > t.adaptive.Refresh {
			v.penalty, v.penaltyAt = p, now
		}
		t.views.mu.Unlock()
	}
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	out := make([]fleetrate.Bucket, len(paced))
	for i, b := range paced {
		f := t.adaptive.factor(t.views.get(b.Key).penaltyNow(now))
		b.Limits = scaled(b.Limits, f)
		out[i] = b
		t.m.effectiveRate(tg, b.Key, b.Limits)
	}
	return out
}

// decrease lowers the effective rate of the buckets a 429 on a request
// sent at sent concerns, fleet-wide, by raising their penalty markers. A
// request sent before this process last lowered the rate reports what the
// lowered rate has already answered, so it lowers nothing more. It reports
// whether a bucket was already at its floor.
func (t *Transport) decrease(ctx context.Context, tg Target, buckets []fleetrate.Bucket, sent time.Time, attrs []slog.Attr) (atFloor bool) {
	if t.adaptive.Off || tg.Fixed {
		return false
	}
	now := time.Now()
	type raise struct {
		b        fleetrate.Bucket
		to       time.Duration // the new penalty
		from, at float64       // the effective rates, as fractions
	}
	var raises []raise
	t.views.mu.Lock()
	for _, b := range buckets {
		v := t.views.get(b.Key)
		p := v.penaltyNow(now)
		from := t.adaptive.factor(p)
		to := max(from*t.adaptive.Decrease, t.adaptive.Floor)
		if to == t.adaptive.Floor && !v.floored.IsZero() && sent.After(v.floored) {
			// Sent after a 429 had brought the rate to its floor, and
			// limited all the same: lowering it further would not help.
			atFloor = true
		}
		if sent.Before(v.decreased) {
			continue
		}
		switch {
		case to > t.adaptive.Floor:
			v.floored = time.Time{} // climbed off the floor since
		case v.floored.IsZero():
			v.floored = now
		}
		target := time.Duration((1 - to) * float64(t.adaptive.Recovery))
		if target <= p {
			continue
		}
		v.penalty, v.penaltyAt, v.decreased = target, now, now
		raises = append(raises, raise{b: b, to: target, from: from, at: to})
	}
	t.views.mu.Unlock()
	for _, r := range raises {
		// A drain only raises a marker's debt: processes that lower the
		// rate at once agree on the lowest.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		err := t.lim.Store().Drain(dctx, []fleetrate.Bucket{rateMarker(r.b)}, r.to)
		cancel()
		t.log.LogAttrs(ctx, slog.LevelWarn, "rate_adapted", append(attrs,
			slog.String("bucket", r.b.Key),
			slog.Float64("from", r.from), slog.Float64("to", r.at),
			slog.Float64("rate", r.at*r.b.Limits[0].Rate),
			slog.Any("error", err))...)
	}
	if atFloor {
		t.m.persistent(tg)
		t.log.LogAttrs(ctx, slog.LevelError, "rate_limit_persistent", append(attrs,
			slog.Float64("floor", t.adaptive.Floor))...)
	}
	return atFloor
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
	res, err := store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{rateMarker(b)}})
	if err != nil {
		return 0, err
	}
	return a.factor(max(res.ResetAfter-markerFill, 0)), nil
}
