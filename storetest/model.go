package storetest

import (
	"context"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
)

// matchesModel drives random operations and checks every decision, and
// every stored state the store can show, against gcra.Decide run on
// the store's own clock.
func matchesModel(t *testing.T, s fleetrate.Store, key func(string) string) {
	m := &modelRun{t: t, s: s, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)), model: map[string]*gcra.State{}}
	m.reader, _ = s.(StateReader)
	m.buckets = []fleetrate.Bucket{
		{Key: key("{m}/a"), Limits: []fleetrate.Limit{fleetrate.PerSecond(2000, 5)}},
		{Key: key("{m}/b"), Limits: []fleetrate.Limit{fleetrate.PerSecond(700, 3), fleetrate.PerSecond(3, 7)}},
		{Key: key("{m}/c"), Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 4), fleetrate.PerSecond(333, 9)}},
		// Limits of fill times beyond fleetrate.CoarseFillTime (365/year,
		// 365 per two years): their debts pass 2^53 ns, exact in the Lua
		// mirror only as whole microseconds.
		{Key: key("{m}/d"), Limits: []fleetrate.Limit{fleetrate.PerSecond(50, 10), fleetrate.Every(24*time.Hour, 365)}},
	}
	a, b, c, d := m.buckets[0].Key, m.buckets[1].Key, m.buckets[2].Key, m.buckets[3].Key
	m.alts = map[string][][]fleetrate.Limit{
		a: {{fleetrate.PerSecond(2000, 3)}, {fleetrate.PerSecond(2000, 5), fleetrate.PerSecond(50, 9)}},
		b: {{fleetrate.PerSecond(3, 7), fleetrate.PerSecond(700, 3)}, {fleetrate.PerSecond(700, 5), fleetrate.PerSecond(3, 7)}, {fleetrate.PerSecond(3, 7)}},
		c: {{fleetrate.PerSecond(1e6, 4)}, {fleetrate.PerSecond(333, 9), fleetrate.PerSecond(1e5, 4)}},
		d: {{fleetrate.Every(48*time.Hour, 365)}, {fleetrate.PerSecond(50, 10), fleetrate.Every(12*time.Hour, 365)},
			{fleetrate.Every(24*time.Hour, 365), fleetrate.PerSecond(7, 3)}, {fleetrate.PerSecond(50, 10), fleetrate.Every(time.Hour, 30)}},
	}
	for _, b := range m.buckets {
		m.model[b.Key] = &gcra.State{}
	}
	for step := range 300 {
		bs := m.pick()
		switch op := m.rng.IntN(12); {
		case op < 7:
			m.take(step, bs)
		case op < 9:
			m.cancel()
		case op < 10:
			if !m.refund(bs) {
				return // the model can't follow without the store's time
			}
		default:
			if !m.drain(bs) {
				return
			}
		}
		if m.reader != nil {
			for _, b := range m.buckets {
				compareState(t, step, m.reader, b, *m.model[b.Key])
			}
		}
	}
}

// modelRun is one run of matchesModel: the store, the model's state of
// each bucket, and the bookings a cancel may return.
type modelRun struct {
	t        *testing.T
	s        fleetrate.Store
	reader   StateReader // nil when the store shows no state
	rng      *rand.Rand
	buckets  []fleetrate.Bucket
	model    map[string]*gcra.State
	bookings []modelBooking
	// alts holds other configurations of each bucket's limits, which
	// some takes use (see take).
	alts map[string][][]fleetrate.Limit
}

// modelBooking is a take's booking, kept for a later cancel.
type modelBooking struct {
	bs []fleetrate.Bucket
	n  int64
	b  fleetrate.Booking
}

// pick returns a random non-empty subset of the buckets.
func (m *modelRun) pick() []fleetrate.Bucket {
	out := []fleetrate.Bucket{}
	for _, b := range m.buckets {
		if m.rng.IntN(2) == 0 {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		out = append(out, m.buckets[m.rng.IntN(len(m.buckets))])
	}
	return out
}

// take makes a random take of bs, sometimes with a reserve or a booking,
// and checks the store's result and booking against the model's.
func (m *modelRun) take(step int, bs []fleetrate.Bucket) {
	t, rng := m.t, m.rng
	for i := range bs {
		// Another configuration of the bucket, as two processes configured
		// apart, a reload or an override take it: a limit changed, moved,
		// added or removed.
		if alts := m.alts[bs[i].Key]; len(alts) > 0 && rng.IntN(3) == 0 {
			bs[i].Limits = alts[rng.IntN(len(alts))]
		}
	}
	req := fleetrate.Request{Buckets: bs, N: rng.Int64N(4), MaxWait: time.Duration(rng.Int64N(int64(20 * time.Millisecond)))}
	if rng.IntN(3) == 0 {
		req.MaxWait = 0
	}
	for i := range bs {
		// A lower priority class on some buckets: a reserve the take can
		// leave.
		if room := minBurst(bs[i].Limits) - max(req.N, 1); room > 0 && rng.IntN(3) == 0 {
			bs[i].Reserve = 1 + rng.Int64N(room)
		}
	}
	var got, want fleetrate.Booking
	if rng.IntN(2) == 0 {
		req.Booking = &got
	}
	res := mustTake(t, m.s, req)
	states := make([]gcra.State, len(bs))
	for i, b := range bs {
		states[i] = cloneState(*m.model[b.Key])
	}
	mreq := req
	if req.Booking != nil {
		mreq.Booking = &want
	}
	wantRes, changed := gcra.Decide(res.At.UnixMicro(), mreq, states)
	if changed {
		// A take that books nothing writes nothing (see fleetrate.Store).
		for i, b := range bs {
			*m.model[b.Key] = states[i]
		}
	}
	_, approx := m.s.(ApproximateDenials)
	cached := approx && !res.Allowed && !wantRes.Allowed && res.Bucket == wantRes.Bucket &&
		res.LimitIndex == wantRes.LimitIndex && res.RetryAfter <= wantRes.RetryAfter+time.Microsecond
	if !reflect.DeepEqual(res, wantRes) && !cached {
		t.Fatalf("step %d: store decided\n%+v\nmodel decided\n%+v", step, res, wantRes)
	}
	if got.Stamp != want.Stamp || !slices.Equal(got.Debts, want.Debts) {
		t.Fatalf("step %d: store booked %+v, model booked %+v", step, got, want)
	}
	if len(got.Debts) > 0 {
		m.bookings = append(m.bookings, modelBooking{bs, req.N, got})
	}
}

// cancel cancels a random booking and follows it in the model; it does
// nothing without a booking or a StateReader.
func (m *modelRun) cancel() {
	if len(m.bookings) == 0 || m.reader == nil {
		return
	}
	i := m.rng.IntN(len(m.bookings))
	bk := m.bookings[i]
	m.bookings = slices.Delete(m.bookings, i, i+1)
	if err := m.s.Cancel(context.Background(), bk.bs, bk.n, bk.b); err != nil {
		m.t.Fatal(err)
	}
	off := 0
	wait := gcra.BookedWait(bk.bs, bk.b.Debts)
	for _, b := range bk.bs {
		n := len(b.Limits)
		syncModel(m.t, m.reader, b, m.model[b.Key], func(now int64, st *gcra.State) {
			gcra.Cancel(now, b.Limits, st, bk.n, bk.b.Stamp, bk.b.Debts[off:off+n], wait)
		})
		off += n
	}
}

// refund refunds a random count to bs and follows it in the model. It
// reports false when the model cannot follow (no StateReader).
func (m *modelRun) refund(bs []fleetrate.Bucket) bool {
	n := m.rng.Int64N(3)
	// A grant up to a second ago (or a little ahead, as another clock
	// may tell it), on a bucket with or without a reserve.
	at := time.Now().Add(time.Duration(m.rng.Int64N(int64(1200*time.Millisecond))) - time.Second).Truncate(time.Microsecond)
	r := m.rng.Int64N(2)
	rbs := slices.Clone(bs)
	for i := range rbs {
		rbs[i].Reserve = min(r, minBurst(rbs[i].Limits)-1)
	}
	return m.apply(rbs, func() error { return m.s.Refund(context.Background(), rbs, n, at) },
		func(now int64, b fleetrate.Bucket, st *gcra.State) {
			gcra.Refund(now, b.Limits, st, n, at.UnixMicro(), b.Reserve)
		})
}

// drain drains bs for a random time and follows it in the model. It
// reports false when the model cannot follow (no StateReader).
func (m *modelRun) drain(bs []fleetrate.Bucket) bool {
	d := time.Duration(m.rng.Int64N(int64(5 * time.Millisecond)))
	return m.apply(bs, func() error { return m.s.Drain(context.Background(), bs, d) },
		func(now int64, b fleetrate.Bucket, st *gcra.State) { gcra.Drain(now, b.Limits, st, d, false) })
}

// apply runs call, a store operation on bs, then op on each bucket's model
// at the time the store stamped it. It reports false when the model cannot
// follow (no StateReader).
func (m *modelRun) apply(bs []fleetrate.Bucket, call func() error, op func(int64, fleetrate.Bucket, *gcra.State)) bool {
	if err := call(); err != nil {
		m.t.Fatal(err)
	}
	if m.reader == nil {
		return false
	}
	for _, b := range bs {
		syncModel(m.t, m.reader, b, m.model[b.Key], func(now int64, st *gcra.State) { op(now, b, st) })
	}
	return true
}

// syncModel applies op to the model at the time the store stamped the
// bucket it wrote. A bucket the store deleted was left full.
func syncModel(t *testing.T, r StateReader, b fleetrate.Bucket, m *gcra.State, op func(int64, *gcra.State)) {
	t.Helper()
	st, ok, err := r.State(context.Background(), b.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		*m = gcra.State{}
		return
	}
	op(st.Stamp, m)
}

// compareState checks that the store's state and the model's mean the same
// bucket: refilled to a common time, every debt matches. A store may drop
// a bucket once it has refilled, so an absent bucket only has to be one
// the model says is full by now (with a second of slack for the store's
// clock).
func compareState(t *testing.T, step int, r StateReader, b fleetrate.Bucket, m gcra.State) {
	t.Helper()
	st, ok, err := r.State(context.Background(), b.Key)
	if err != nil {
		t.Fatal(err)
	}
	m = cloneState(m)
	if !ok {
		m.Elapse(max(m.Stamp, time.Now().Add(time.Second).UnixMicro()), b.Limits)
		for _, d := range m.Debts {
			if d != 0 {
				t.Fatalf("step %d: bucket %q: store dropped it, model debts %v", step, b.Key, m.Debts)
			}
		}
		return
	}
	st = cloneState(st)
	now := max(st.Stamp, m.Stamp)
	st.Elapse(now, b.Limits)
	m.Elapse(now, b.Limits)
	if !slices.Equal(st.Debts, m.Debts) {
		t.Fatalf("step %d: bucket %q: store debts %v, model debts %v (at %d)", step, b.Key, st.Debts, m.Debts, now)
	}
}

func cloneState(s gcra.State) gcra.State { return s.Clone() }
