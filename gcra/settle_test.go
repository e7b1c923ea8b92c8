package gcra

import (
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/inflight"
)

// FuzzSettleBound drives takes of estimated costs by up to four callers
// at once, each settled to its real cost (half to one and a half times the
// estimate) some operations later, and checks the bound the docs state
// (docs/ARCHITECTURE.md, "What one take carries"): in every window from a
// grant to a later one, the real costs of the grants in it stay within
// burst + rate × window plus the under-estimates of those of its grants
// not yet settled when its last grant was decided.
func FuzzSettleBound(f *testing.F) {
	f.Add(uint16(50), uint16(100), []byte{3, 40, 1, 200, 7, 90, 2, 150, 5, 30, 0, 255})
	f.Add(uint16(1000), uint16(10), []byte{1, 1, 1, 1, 255, 255, 128, 0})
	f.Fuzz(func(t *testing.T, rate, burst uint16, ops []byte) {
		lim := fleetrate.Limit{Rate: float64(rate%5000 + 1), Burst: int64(burst%2000 + 2)}
		if lim.Validate() != nil {
			return
		}
		limits := []fleetrate.Limit{lim}
		b := fleetrate.Bucket{Key: "k", Limits: limits}
		st := []State{{}}
		now := int64(1_700_000_000_000_000)
		var grants []*settled
		var open []*settled // at most 4 callers in flight
		for i := 0; i+1 < len(ops); i += 2 {
			now += int64(ops[i]) * lim.Interval() / 1000 / 8
			if len(open) == 4 || ops[i+1]&1 == 1 && len(open) > 0 {
				g := open[0]
				open = open[1:]
				Settle(now, limits, &st[0], g.cost, g.actual, g.at/1000, 0)
				g.settle = i
				continue
			}
			cost := int64(ops[i+1])%lim.Burst + 1
			res, _ := Decide(now, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: cost}, st)
			if !res.Allowed {
				continue
			}
			// Real cost: 50 % to 150 % of the estimate, at most a burst.
			actual := min(cost*int64(50+ops[i]%101)/100, lim.Burst)
			g := &settled{at: now * 1000, cost: cost, actual: actual, decided: i, settle: -1}
			grants, open = append(grants, g), append(open, g)
		}
		checkSettleBound(t, lim, grants)
	})
}

// settled is a grant for checkSettleBound: when (ns), its estimate and
// real cost, the op that decided it and the op that settled it (-1:
// never).
type settled struct {
	at, cost, actual int64
	decided, settle  int
}

// checkSettleBound checks the bound over every window of grants.
func checkSettleBound(t *testing.T, lim fleetrate.Limit, gs []*settled) {
	t.Helper()
	iv := lim.Interval()
	for i := range gs {
		var real, late int64
		for j := i; j < len(gs); j++ {
			real += gs[j].actual
			// Under-estimates of the window's grants open when gs[j]
			// was decided.
			late = 0
			for k := i; k <= j; k++ {
				if open := gs[k].settle < 0 || gs[k].settle > gs[j].decided; open && gs[k].actual > gs[k].cost {
					late += gs[k].actual - gs[k].cost
				}
			}
			w := gs[j].at - gs[i].at
			if real*iv > lim.Burst*iv+w+late*iv {
				t.Fatalf("grants %d..%d over %v: real costs %d > burst %d + %v of rate + %d under-estimated and open", i, j, time.Duration(w), real, lim.Burst, time.Duration(w), late)
			}
		}
	}
}

// FuzzPermits drives takes with permits, renewals and releases by eight
// holders of a bucket of bound 3 and checks, from the grants alone, that
// no more than 3 leases are ever live at once, and that a permit nobody
// holds is granted to a take that may not wait unless waiters are queued.
func FuzzPermits(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 200, 9, 17, 33})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const bound = 3
		b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 1e6)}, InFlight: bound}
		st := []State{{}}
		now := int64(1_700_000_000_000_000)
		leases := map[string]int64{} // holder → lease end (µs), from the grants seen
		for _, op := range ops {
			id := string(rune('a' + op%8))
			ttl := time.Second * time.Duration(1+op/64)
			switch op / 8 % 4 {
			case 0: // time passes
				now += int64(op) * 10_000
			case 1, 2: // a take, waiting or not
				maxWait := time.Duration(0)
				if op/8%4 == 2 {
					maxWait = time.Second
				}
				res, _ := Decide(now, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: maxWait, Permit: fleetrate.Permit{ID: id, TTL: ttl}}, st)
				if res.Allowed {
					leases[id] = max(leases[id], now+int64(ttl/time.Microsecond))
				}
			case 3:
				st[0].Permits.Expire(now)
				if op&1 == 0 {
					st[0].Permits.Release(id)
					delete(leases, id)
				} else {
					holds := slices.ContainsFunc(st[0].Permits.Held, func(l inflight.Lease) bool { return l.ID == id })
					if st[0].Permits.Renew(id, now+int64(ttl/time.Microsecond)) && holds {
						leases[id] = max(leases[id], now+int64(ttl/time.Microsecond))
					}
				}
			}
			live := 0
			for _, end := range leases {
				if end > now {
					live++
				}
			}
			if live > bound {
				t.Fatalf("%d leases live at once, bound %d: %v at %d", live, bound, leases, now)
			}
		}
	})
}
