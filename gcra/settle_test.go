package gcra

import (
	"cmp"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/inflight"
)

// FuzzSettleBound drives takes of estimated costs by up to four callers
// at once, some of a lower class (a reserve), each settled to its real
// cost (half to one and a half times the estimate) some operations later,
// in any order, once its slot has begun, and checks
// the bound the docs state (docs/ARCHITECTURE.md, "What one take
// carries"): in every window from a grant's slot to a later one's, the
// real costs of the grants in it stay within burst + rate × window plus
// the under-estimates of those of its grants not yet settled when the
// last of them was decided. Some takes may wait (Reserve, Wait, the
// transport): they book a slot ahead, and a settle that gives back must
// then give back nothing a booked slot relies on.
func FuzzSettleBound(f *testing.F) {
	f.Add(uint16(50), uint16(100), []byte{3, 40, 1, 200, 7, 90, 2, 150, 5, 30, 0, 255})
	f.Add(uint16(1000), uint16(10), []byte{1, 1, 1, 1, 255, 255, 128, 0})
	f.Fuzz(func(t *testing.T, rate, burst uint16, ops []byte) {
		lim := fleetrate.Limit{Rate: float64(rate%5000 + 1), Burst: int64(burst%2000 + 2)}
		if lim.Validate() != nil {
			return
		}
		if len(ops) > 600 {
			ops = ops[:600] // the check is cubic in the grants
		}
		limits := []fleetrate.Limit{lim}
		b := fleetrate.Bucket{Key: "k", Limits: limits}
		// A lower class keeps a reserve of a quarter of the burst; a
		// settle passes it, as Reservation.Settle passes the lowest
		// class's reserve.
		reserve := lim.Burst / 4
		st := []State{{}}
		now := int64(1_700_000_000_000_000)
		var grants []*settled
		var open []*settled // at most 4 callers in flight
		for i := 0; i+1 < len(ops); i += 2 {
			now += int64(ops[i]) * lim.Interval() / 1000 / 8
			if len(open) == 4 || ops[i+1]&1 == 1 && len(open) > 0 {
				// Any caller's work may end first.
				k := int(ops[i+1]>>1) % len(open)
				g := open[k]
				open = slices.Delete(open, k, k+1)
				// The work is done after its slot has begun.
				now = max(now, (g.at+999)/1000)
				Settle(now, limits, &st[0], g.cost, g.actual, g.at/1000, reserve)
				g.settle = i
				continue
			}
			cost := int64(ops[i+1])%lim.Burst + 1
			var maxWait time.Duration
			if ops[i]&2 == 2 { // a take that may wait: up to a fill time
				maxWait = time.Duration(int64(ops[i]%4+1) * lim.Burst * lim.Interval() / 4)
			}
			rb := b
			if ops[i]&4 == 4 && cost+reserve <= lim.Burst {
				rb.Reserve = reserve // a take of the lower class
			}
			res, _ := Decide(now, fleetrate.Request{Buckets: []fleetrate.Bucket{rb}, N: cost, MaxWait: maxWait}, st)
			if !res.Allowed {
				continue
			}
			// Real cost: 50 % to 150 % of the estimate, at most a burst.
			actual := min(cost*int64(50+ops[i]%101)/100, lim.Burst)
			g := &settled{at: now*1000 + int64(res.Wait), cost: cost, actual: actual, decided: i, settle: -1}
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

// checkSettleBound checks the bound over every window of grants, in the
// order of their slots.
func checkSettleBound(t *testing.T, lim fleetrate.Limit, gs []*settled) {
	t.Helper()
	gs = slices.Clone(gs)
	slices.SortStableFunc(gs, func(a, b *settled) int { return cmp.Compare(a.at, b.at) })
	iv := lim.Interval()
	for i := range gs {
		var real, late int64
		last := -1 // the op that decided the window's last decided grant
		for j := i; j < len(gs); j++ {
			real += gs[j].actual
			last = max(last, gs[j].decided)
			// Under-estimates of the window's grants open when its
			// last grant was decided.
			late = 0
			for k := i; k <= j; k++ {
				if open := gs[k].settle < 0 || gs[k].settle > last; open && gs[k].actual > gs[k].cost {
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

// s is a second in µs, gcra's time unit; t0 is a time (µs) the settle
// examples start at.
const (
	s  = int64(1_000_000)
	t0 = 1_700_000_000 * s
)

// oneLimit is a bucket of the one limit lim: its limits, its state, and a
// take of n tokens at at (µs) that says whether it was granted.
func oneLimit(lim fleetrate.Limit) ([]fleetrate.Limit, []State, func(at, n int64) bool) {
	limits := []fleetrate.Limit{lim}
	b := fleetrate.Bucket{Key: "k", Limits: limits}
	st := []State{{}}
	return limits, st, func(at, n int64) bool {
		res, _ := Decide(at, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: n}, st)
		return res.Allowed
	}
}

// TestSettleGivesBackOnlyTheSlackOfLaterGrants: giving an over-estimate
// back in full whenever the bucket has not been full since the grant's
// slot is not exact. At 1 token a second, burst 2: a grant of 1 at 0 s
// that really cost nothing, a grant of 1 at 0.9 s (the bucket held 1.9,
// not full), and a settle of the first at 1 s. Had the first cost nothing
// from the start, the second would have found the bucket full at 0.9 s
// and the refill until then would have been lost: the bucket would hold
// 1.1 at 1 s, not 2. Giving the whole token back would admit a take of 2
// at 1 s, 3 tokens in 0.1 s where the bound allows 2.1. What can go back
// exactly is at most the slack (debt) each later grant found, here 0.1
// token; gcra.Settle, which gives back what time has not refilled since
// the slot (1 token less 1 s: nothing) refuses the take.
func TestSettleGivesBackOnlyTheSlackOfLaterGrants(t *testing.T) {
	lim := fleetrate.Limit{Rate: 1, Burst: 2}
	limits, st, take := oneLimit(lim)
	if !take(t0, 1) || !take(t0+9*s/10, 1) {
		t.Fatal("the first two grants were refused")
	}
	naive := st[0].Clone()
	Settle(t0+s, limits, &st[0], 1, 0, t0, 0)
	naive.Elapse(t0+s, limits)
	naive.Debts[0] = max(naive.Debts[0]-lim.Interval(), 0) // the whole token back
	var res fleetrate.Result
	if !DecideOne(t0+s, limits, 2, 0, &naive, &res) {
		t.Fatal("the naive give-back did not admit 2 at 1 s; the example is wrong")
	}
	if take(t0+s, 2) {
		t.Fatalf("after gcra.Settle a take of 2 at 1 s was granted: 3 tokens in 0.1 s at burst 2, rate 1/s")
	}
}

// TestSettleLowersTheLeadsAfterIt: a give-back lowers the leads of the
// takes after the grant, which are that much lower in the chain where it
// cost less. At 1 token a second, burst 20, kept busy until 15 s before
// 0 s (so the summary's epochs of 40 s know the grants): a grant g of 5
// at 0 s (the bucket held 16) and h of 4 at 0 s, a grant k of 1 at 12 s
// (the bucket held 19: lead 1); h settled to 0 at 12 s gets back 1 token
// (k's lead). Then g settled to 0 must get nothing: had both cost nothing,
// k would have found the bucket full and left 19 tokens, not 20. Without
// the lowering, g's least lead would still read 1 and a take of the whole
// burst at 12 s would be granted: 21 tokens at one instant.
func TestSettleLowersTheLeadsAfterIt(t *testing.T) {
	lim := fleetrate.Limit{Rate: 1, Burst: 20}
	limits, st, take := oneLimit(lim)
	for at := t0 - 60*s; at < t0-15*s; at += s / 2 {
		take(at, 1) // twice the rate: empty from about 40 s before
	}
	if !take(t0, 5) || !take(t0, 4) || !take(t0+12*s, 1) {
		t.Fatal("g, h or k was refused")
	}
	Settle(t0+12*s, limits, &st[0], 4, 0, t0, 0) // h
	if got, want := st[0].Debts[0], 1*lim.Interval(); got != want {
		t.Fatalf("after h's settle the debt is %d ns, want %d (1 token: k's lead)", got, want)
	}
	Settle(t0+12*s, limits, &st[0], 5, 0, t0, 0) // g
	if take(t0+12*s, 20) {
		t.Fatal("a take of the whole burst was granted at 12 s after k's: 21 tokens at once")
	}
}
