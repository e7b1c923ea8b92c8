package pacer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
	"github.com/fleetrate/fleetrate/transport/internal/schedule"
	"github.com/fleetrate/fleetrate/transport/internal/sendtime"
)

// known is what this process knows of one bucket it paces: one value per
// concept, each changed only through its own package's functions.
type known struct {
	hold  hold.Known        // its pause
	rate  rateView          // its rate controller's state
	sends sendtime.History  // what this process sent of it
	rtt   sendtime.RTTFloor // the quickest recent answer (an endpoint with a Spacing)
	gate  sendtime.RTTFloor // the quickest recent take of its spacing gate
	// next is when the bucket's next token was free, as the last booking
	// this process made left it (local clock): a request whose wait budget
	// ends sooner fails with backpressure without asking the store.
	next time.Time
}

// rateView is the rate controller's state of a bucket and when its climb
// was last read from the store (zero: read it before the next take).
type rateView struct {
	st   ratecontrol.State
	read time.Time
}

// knowledge holds what a transport knows of its buckets.
type knowledge struct {
	mu sync.Mutex
	m  map[string]*known
	// inRow counts the buckets whose rate state has a row of 429s taken as
	// pauses too short, so that an admitted request, when none has, costs
	// no lock (see Pacer.Admitted).
	inRow atomic.Int32
}

// get returns the bucket's knowledge. k.mu is held.
func (k *knowledge) get(key string) *known {
	if k.m == nil {
		k.m = map[string]*known{}
	}
	v := k.m[key]
	if v == nil {
		v = &known{}
		k.m[key] = v
	}
	return v
}

// setRate sets v's rate state, keeping inRow. k.mu is held.
func (k *knowledge) setRate(v *known, st ratecontrol.State) {
	switch {
	case v.rate.st.Soon == 0 && st.Soon > 0:
		k.inRow.Add(1)
	case v.rate.st.Soon > 0 && st.Soon == 0:
		k.inRow.Add(-1)
	}
	v.rate.st = st
}

// learnPause records a pause of bucket key until until, learned at now
// from the store or an announcement. A pause that is news ends the
// fleet's stretch of requests (after this process last saw no pause) for
// the rate controller, and makes the next take read the climb again: the
// 429 behind it may have lowered the rate. k.mu is held.
func (p *Pacer) learnPause(v *known, key string, until, now time.Time) (news bool) {
	if v.hold.News(until) {
		if b, err := p.cfg.Limiter.Bucket(key); err == nil {
			since := v.stretchFrom(v.hold.Until)
			p.known.setRate(v, p.cfg.Rates.EndStretch(v.rate.st, paceRate(b), since, v.hold.Seen))
		}
		v.rate.read = time.Time{}
	}
	return v.hold.Learn(until, now)
}

// stretchFrom returns when the fleet's stretch of requests that a 429
// ends began: at resumed, the end of the last pause, or, with none known,
// at this process's first request (zero if it sent none).
func (v *known) stretchFrom(resumed time.Time) time.Time {
	if resumed.IsZero() {
		return v.sends.Began
	}
	return resumed
}

// fleet is schedule.Fleet for one request's target: what this process
// knows of the target's buckets.
type fleet struct {
	p  *Pacer
	tg Target
}

var _ schedule.Fleet = fleet{}

// HeldUntil implements schedule.Fleet.
func (f fleet) HeldUntil(paced []fleetrate.Bucket, since time.Time) (until time.Time, fresh bool) {
	k := &f.p.known
	k.mu.Lock()
	defer k.mu.Unlock()
	fresh = true
	for _, b := range paced {
		v := k.get(b.Key)
		until = later(until, v.hold.Until)
		if v.hold.Seen.Before(since) {
			fresh = false
		}
	}
	return until, fresh
}

// HeldSince implements schedule.Fleet.
func (f fleet) HeldSince(paced []fleetrate.Bucket, at time.Time) bool {
	k := &f.p.known
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, b := range paced {
		if k.get(b.Key).hold.At.After(at) {
			return true
		}
	}
	return false
}

// NextFree implements schedule.Fleet.
func (f fleet) NextFree(paced []fleetrate.Bucket) time.Time {
	k := &f.p.known
	k.mu.Lock()
	defer k.mu.Unlock()
	var next time.Time
	for _, b := range paced {
		next = later(next, k.get(b.Key).next)
	}
	return next
}

// LearnNext implements schedule.Fleet.
func (f fleet) LearnNext(key string, next time.Time) {
	k := &f.p.known
	k.mu.Lock()
	defer k.mu.Unlock()
	v := k.get(key)
	v.next = later(v.next, next)
}

// Layout implements schedule.Fleet.
func (f fleet) Layout(ctx context.Context, paced []fleetrate.Bucket) hold.Take {
	return f.p.layout(ctx, f.tg, paced)
}

// Learn implements schedule.Fleet: it reads the booking's debts into
// this process's knowledge, and asks for the booking again when it was
// behind a pause this process did not know of and the target's rate is
// adaptive.
func (f fleet) Learn(tk hold.Take, b fleetrate.Booking, at time.Time) (rebook bool) {
	seen, ok := tk.Read(b)
	if !ok {
		return false
	}
	k := &f.p.known
	k.mu.Lock()
	defer k.mu.Unlock()
	news := false
	for i, bk := range tk.Paced() {
		v := k.get(bk.Key)
		v.next = at.Add(seen[i].Next)
		if seen[i].Pause > 0 && f.p.learnPause(v, bk.Key, at.Add(seen[i].Pause), at) {
			news = true
		}
		v.hold.Seen = at
	}
	return news && f.p.adapts(f.tg)
}

// Spread implements schedule.Fleet with sendtime.Spread over this
// process's send history of the buckets.
func (f fleet) Spread(paced []fleetrate.Bucket, due, now time.Time) (wait time.Duration, void bool) {
	k := &f.p.known
	k.mu.Lock()
	defer k.mu.Unlock()
	hs := make([]sendtime.History, len(paced))
	for i, b := range paced {
		hs[i] = k.get(b.Key).sends
	}
	at, void := sendtime.Spread(paced, hs, due, now)
	if void {
		return 0, true
	}
	for _, b := range paced {
		k.get(b.Key).sends.Record(at)
	}
	return at.Sub(now), false
}

// Listening implements schedule.Fleet.
func (f fleet) Listening(at time.Time) bool { return f.p.ann.Listening(at) }

// ReadHolds implements schedule.Fleet: one peek of the take's pause
// markers, into this process's knowledge.
func (f fleet) ReadHolds(ctx context.Context, tk hold.Take, bk fleetrate.Booking) (drained bool, err error) {
	p := f.p
	res, err := p.cfg.Limiter.Store().Take(ctx, fleetrate.Request{Buckets: tk.Markers()})
	if err != nil {
		return false, err
	}
	now := p.cfg.Now()
	drained = tk.DrainedSince(bk, res)
	p.known.mu.Lock()
	defer p.known.mu.Unlock()
	for _, b := range tk.Paced() {
		v := p.known.get(b.Key)
		if !res.Allowed {
			p.learnPause(v, b.Key, now.Add(res.RetryAfter), now)
		}
		v.hold.Seen = now
		if drained {
			v.rate.read = time.Time{} // the 429 may have lowered the rate
		}
	}
	return drained, nil
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
