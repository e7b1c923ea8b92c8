package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
	"github.com/fleetrate/fleetrate/inflight"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// TestExtendedMatchesModel runs random takes with costs by bucket and
// in-flight permits, settles, cancels and releases on Redis and on gcra's
// pure functions side by side, at the instants the scripts stamped: every
// decision (its InFlight included), every stored debt and every lead
// (gcra.Lead, by which a settle gives back) must be the model's. Leases last a minute, so none lapses during the test.
func TestExtendedMatchesModel(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(), Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 37))
	t.Logf("seed %d", seed)
	buckets := []fleetrate.Bucket{
		{Key: "{x}/a", Limits: []fleetrate.Limit{fleetrate.PerSecond(2000, 9)}, InFlight: 2},
		{Key: "{x}/b", Limits: []fleetrate.Limit{fleetrate.PerSecond(700, 6), fleetrate.PerSecond(3, 11)}},
		{Key: "{x}/c", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 8), fleetrate.PerSecond(333, 12)}, InFlight: 3},
		{Key: "{x}/d", Limits: []fleetrate.Limit{fleetrate.PerSecond(500, 7)}}, // take_one.lua's path when alone
	}
	tokens := map[string]*gcra.State{}
	permits := map[string]*inflight.Set{}
	for _, b := range buckets {
		tokens[b.Key], permits[b.Key] = &gcra.State{}, &inflight.Set{}
	}
	type booking struct {
		bs []fleetrate.Bucket
		b  fleetrate.Booking
		at time.Time
	}
	var bookings []booking
	var holders []string
	count := map[string]int{}
	defer func() { t.Logf("%v", count) }()
	for step := range 400 {
		var bs []fleetrate.Bucket
		for _, b := range buckets {
			if rng.IntN(2) == 0 {
				bs = append(bs, b)
			}
		}
		if len(bs) == 0 {
			bs = buckets[1:2]
		}
		switch op := rng.IntN(10); {
		case op < 6: // a take
			req := fleetrate.Request{Buckets: bs, Costs: make([]int64, len(bs)), MaxWait: time.Duration(rng.Int64N(int64(20 * time.Millisecond)))}
			if rng.IntN(3) == 0 {
				req.MaxWait = 0
			}
			bounded := false
			for i := range bs {
				req.Costs[i] = rng.Int64N(minBurst(bs[i].Limits)/2 + 1)
				bounded = bounded || bs[i].InFlight > 0
			}
			if bounded {
				req.Permit = fleetrate.Permit{ID: fmt.Sprintf("p%d", rng.IntN(8)), TTL: time.Minute}
			}
			var got, want fleetrate.Booking
			req.Booking = &got
			res, err := s.Take(ctx, req)
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			states := make([]gcra.State, len(bs))
			for i, b := range bs {
				states[i] = tokens[b.Key].Clone()
				states[i].Permits = permits[b.Key].Clone()
			}
			mreq := req
			mreq.Booking = &want
			wantRes, changed := gcra.Decide(res.At.UnixMicro(), mreq, states)
			if changed {
				for i, b := range bs {
					p := states[i].Permits
					states[i].Permits = inflight.Set{}
					*tokens[b.Key], *permits[b.Key] = states[i], p
				}
			}
			if !sameResult(res, wantRes) {
				t.Fatalf("step %d: %+v\nstore decided %+v\nmodel decided %+v", step, req, res, wantRes)
			}
			if got.Stamp != want.Stamp || !slices.Equal(got.Debts, want.Debts) || !slices.Equal(got.Costs, want.Costs) {
				t.Fatalf("step %d: store booked %+v, model %+v", step, got, want)
			}
			switch {
			case res.Allowed:
				count["granted"]++
			case res.InFlight.Queued:
				count["queued"]++
			default:
				count["denied"]++
			}
			if res.Allowed && len(got.Debts) > 0 {
				bookings = append(bookings, booking{bs, got, res.At.Add(res.Wait)})
			}
			if res.Allowed && req.Permit.ID != "" {
				holders = append(holders, req.Permit.ID)
			}
		case op < 8 && len(bookings) > 0: // settle or cancel a booking
			i := rng.IntN(len(bookings))
			bk := bookings[i]
			bookings = slices.Delete(bookings, i, i+1)
			if rng.IntN(2) == 0 {
				count["cancelled"]++
				if err := s.Cancel(ctx, bk.bs, 0, bk.b); err != nil {
					t.Fatalf("step %d: cancel: %v", step, err)
				}
				off, wait := 0, gcra.BookedWait(bk.bs, bk.b.Debts)
				for j, b := range bk.bs {
					m := len(b.Limits)
					syncTokens(t, s, b, tokens[b.Key], func(now int64, st *gcra.State) {
						gcra.Cancel(now, b.Limits, st, bk.b.Costs[j], bk.b.Stamp, bk.b.Debts[off:off+m], wait)
					})
					off += m
				}
				break
			}
			st := fleetrate.Settlement{Costs: bk.b.Costs, Actual: make([]int64, len(bk.bs)), At: bk.at}
			for j, b := range bk.bs {
				st.Actual[j] = rng.Int64N(minBurst(b.Limits) + 1)
			}
			count["settled"]++
			if err := s.Settle(ctx, bk.bs, st); err != nil {
				t.Fatalf("step %d: settle: %v", step, err)
			}
			for j, b := range bk.bs {
				syncTokens(t, s, b, tokens[b.Key], func(now int64, state *gcra.State) {
					gcra.Settle(now, b.Limits, state, st.Costs[j], st.Actual[j], bk.at.UnixMicro(), b.Reserve)
				})
			}
		case len(holders) > 0: // a release
			i := rng.IntN(len(holders))
			id := holders[i]
			holders = slices.Delete(holders, i, i+1)
			count["released"]++
			held, err := s.Release(ctx, buckets, id)
			if err != nil {
				t.Fatalf("step %d: release: %v", step, err)
			}
			want := 0
			for _, b := range buckets {
				if b.InFlight > 0 && permits[b.Key].Release(id) {
					want++
				}
			}
			if held != want {
				t.Fatalf("step %d: Release(%s) = %d, model %d", step, id, held, want)
			}
		}
		for _, b := range buckets {
			compareDebts(t, step, s, b, *tokens[b.Key])
		}
	}
}

// sameResult compares two decisions, their times included.
func sameResult(a, b fleetrate.Result) bool { return reflect.DeepEqual(a, b) }

func minBurst(ls []fleetrate.Limit) int64 {
	m := ls[0].Burst
	for _, l := range ls[1:] {
		m = min(m, l.Burst)
	}
	return m
}

// syncTokens applies op to the model m of bucket b at the instant the store
// stamped it; a bucket the store deleted is full.
func syncTokens(t *testing.T, s *Store, b fleetrate.Bucket, m *gcra.State, op func(int64, *gcra.State)) {
	t.Helper()
	st, ok, err := s.State(context.Background(), b.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		*m = gcra.State{}
		return
	}
	op(st.Stamp, m)
}

// compareDebts checks that the stored debts of b are the model's, both
// refilled to a common instant; an absent bucket must be full by now in
// the model (with a second of slack for the store's clock).
func compareDebts(t *testing.T, step int, s *Store, b fleetrate.Bucket, m gcra.State) {
	t.Helper()
	st, ok, err := s.State(context.Background(), b.Key)
	if err != nil {
		t.Fatal(err)
	}
	m = m.Clone()
	if !ok {
		m.Elapse(max(m.Stamp, time.Now().Add(time.Second).UnixMicro()), b.Limits)
		if slices.ContainsFunc(m.Debts, func(d int64) bool { return d != 0 }) {
			t.Fatalf("step %d: bucket %q absent in Redis, model debts %v", step, b.Key, m.Debts)
		}
		return
	}
	now := max(st.Stamp, m.Stamp)
	st.Elapse(now, b.Limits)
	m.Elapse(now, b.Limits)
	if !slices.Equal(st.Debts, m.Debts) {
		t.Fatalf("step %d: bucket %q: Redis debts %v, model %v (at %d)", step, b.Key, st.Debts, m.Debts, now)
	}
	if !slices.Equal(st.Leads, m.Leads) {
		t.Fatalf("step %d: bucket %q: Redis leads %+v, model %+v (at %d)", step, b.Key, st.Leads, m.Leads, now)
	}
}
