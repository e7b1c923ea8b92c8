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
