package gcra

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// FuzzDecide drives the algorithm with arbitrary limits and operations and
// checks its invariants, with takes of lower classes (a reserve) mixed in:
// no grant beyond the max wait, a lower class's debt within its bound,
// remaining tokens within the burst, state that never goes negative, and
// the exact window bound over every grant.
func FuzzDecide(f *testing.F) {
	f.Add(uint32(10), int64(3), []byte{1, 0, 5, 1, 200, 3, 0, 9})
	f.Add(uint32(1_000_000), int64(1), []byte{255, 255, 0, 1, 2, 3})
	f.Fuzz(func(t *testing.T, rate uint32, burst int64, ops []byte) {
		lim := fleetrate.Limit{Rate: float64(rate%1_000_000 + 1), Burst: burst%1000 + 1}
		if lim.Burst < 1 {
			lim.Burst = -lim.Burst + 1
		}
		if lim.Validate() != nil {
			return
		}
		b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{lim}}
		st := []State{{}}
		now := int64(1_700_000_000_000_000)
		type grant struct{ at, n int64 }
		var grants []grant
		for i := 0; i+1 < len(ops); i += 2 {
			now += int64(ops[i]) * lim.Interval() / 1000 / 16
			n := int64(ops[i+1]) % (lim.Burst + 1)
			maxWait := time.Duration(int64(ops[i+1]%4) * lim.Interval())
			rb := b
			if ops[i]&1 == 1 && n < lim.Burst {
				rb.Reserve = int64(ops[i]) % (lim.Burst - n) // a lower class
			}
			req := fleetrate.Request{Buckets: []fleetrate.Bucket{rb}, N: n, MaxWait: maxWait}
			if err := req.Validate(); err != nil {
				t.Fatalf("op %d: %v", i, err)
			}
			res, _ := Decide(now, req, st)
			if res.Allowed && res.Wait > maxWait || !res.Allowed && res.RetryAfter <= maxWait {
				t.Fatalf("op %d: %+v with max wait %v", i, res, maxWait)
			}
			if res.Remaining < 0 || res.Remaining > lim.Burst || st[0].Debts[0] < 0 {
				t.Fatalf("op %d: remaining %d, debt %d", i, res.Remaining, st[0].Debts[0])
			}
			if d := st[0].Debts[0]; res.Allowed && n > 0 && d > (lim.Burst-rb.Reserve)*lim.Interval()+int64(maxWait) {
				t.Fatalf("op %d: reserve %d: debt %d after a grant", i, rb.Reserve, d)
			}
			if res.Allowed && n > 0 {
				grants = append(grants, grant{now*1000 + int64(res.Wait), n})
			}
		}
		// A higher class may be granted ahead of a lower class's booking
		// (that is its point), so grants are checked in time order.
		slices.SortStableFunc(grants, func(a, b grant) int { return cmp.Compare(a.at, b.at) })
		for i := range grants {
			sum := int64(0)
			for j := i; j < len(grants); j++ {
				sum += grants[j].n
				if w := grants[j].at - grants[i].at; sum > lim.Burst+w/lim.Interval() {
					t.Fatalf("%d tokens in %d ns with %v", sum, w, lim)
				}
			}
		}
	})
}

// FuzzConfigurationsInTurn takes from one bucket under two configurations
// of its limit in an arbitrary order (two processes configured apart, a
// reload and its revert, an override beside its rule), as a store does:
// a take that books nothing writes nothing, and a state full in its own
// terms is no state (a store's key expired). Together they must never
// grant more in a window than the looser of the two allows alone, plus one
// burst: a bucket the configuration of the shorter fill time took from
// first, and that refilled in its terms, is full for the other too (a
// store keeps no state of a full bucket), once; after that every state
// written under the shorter fill is anchored (see State.Anchor).
func FuzzConfigurationsInTurn(f *testing.F) {
	// Burst 100 emptied, then two takes at burst 10 a second apart, then
	// burst 100 again (TestConfigurationsInTurn's cycle).
	cycle := []byte{}
	for range 13 {
		cycle = append(cycle, 0, 7) // eight takes under the first, now
	}
	cycle = append(cycle, 201, 200, 201, 200, 200, 199) // a second later each
	for range 12 {
		cycle = append(cycle, 0, 7)
	}
	f.Add(uint16(10), uint16(100), uint16(10), uint16(10), cycle)
	f.Add(uint16(10), uint16(100), uint16(10), uint16(10), []byte{0, 0, 0, 50, 1, 50, 1, 50, 0, 0})
	f.Add(uint16(5), uint16(10), uint16(20), uint16(40), []byte{1, 9, 0, 200, 1, 3})
	f.Fuzz(func(t *testing.T, r1, b1, r2, b2 uint16, ops []byte) {
		cfgs := [2]fleetrate.Limit{
			fleetrate.PerSecond(float64(r1%1000+1), int64(b1%500+1)),
			fleetrate.PerSecond(float64(r2%1000+1), int64(b2%500+1)),
		}
		for _, l := range cfgs {
			if l.Validate() != nil {
				return
			}
		}
		var st State
		now := int64(1_700_000_000_000_000)
		var grants []int64 // ns
		for i := 0; i+1 < len(ops); i += 2 {
			c := cfgs[ops[i]&1]
			now += int64(ops[i]>>1) * int64(ops[i+1]) * 50 // µs, up to about 1.6 s
			for range 1 + int(ops[i+1]%8) {
				cp := st.Clone()
				var res fleetrate.Result
				if DecideOne(now, []fleetrate.Limit{c}, 1, 0, &cp, &res) {
					st = cp
					grants = append(grants, now*1000)
				}
			}
		}
		for j := range grants {
			for k := j; k < len(grants); k++ {
				w := float64(grants[k]-grants[j]) / 1e9
				bound := float64(max(cfgs[0].Burst, cfgs[1].Burst)) // the once
				for _, l := range cfgs {
					bound = max(bound, float64(cfgs[0].Burst+cfgs[1].Burst)+l.Rate*w)
				}
				if float64(k-j+1) > bound+1e-9 {
					t.Fatalf("%v and %v in turn: %d grants in %.6f s, bound %.3f", cfgs[0], cfgs[1], k-j+1, w, bound)
				}
			}
		}
	})
}
