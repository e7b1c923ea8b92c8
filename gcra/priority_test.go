package gcra

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// TestPriorityTimeline pins priorities down on a fixed timeline: a lower
// class that keeps 2 of 5 tokens and books at most 100 ms ahead, and the
// top class finding its reserve.
func TestPriorityTimeline(t *testing.T) {
	t.Parallel()
	lim := fleetrate.PerSecond(10, 5) // 100 ms per token
	low := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{lim}, Reserve: 2}
	high := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{lim}}
	horizon := 100 * time.Millisecond
	t0 := int64(1_700_000_000) * sec
	type step struct {
		b       fleetrate.Bucket
		n       int64
		maxWait time.Duration
		allowed bool
		wait    time.Duration
		retry   time.Duration
	}
	steps := []step{
		{b: low, n: 3, maxWait: horizon, allowed: true},                                 // 2 left: the reserve
		{b: low, n: 1, maxWait: horizon, allowed: true, wait: 100 * time.Millisecond},   // books one ahead, within the horizon
		{b: low, n: 1, maxWait: horizon, allowed: false, retry: 200 * time.Millisecond}, // beyond the horizon
		{b: low, n: 0, allowed: false, retry: 100 * time.Millisecond},                   // a peek of the class sees the reserve
		{b: high, n: 1, allowed: true},                                                  // the reserve is there
		// The low class booked D = 100 ms ahead: the reserve's two tokens
		// together wait D-(R-2)T = 100 ms.
		{b: high, n: 1, maxWait: time.Second, allowed: true, wait: 100 * time.Millisecond},
		{b: high, n: 1, maxWait: time.Second, allowed: true, wait: 200 * time.Millisecond}, // then it queues as usual
		{b: low, n: 1, maxWait: horizon, allowed: false, retry: 500 * time.Millisecond},    // the high class pushed the low one back
	}
	st := []State{{}}
	for i, s := range steps {
		res, _ := Decide(t0, take(s.b, s.n, s.maxWait), st)
		if res.Allowed != s.allowed || res.Wait != s.wait || res.RetryAfter != s.retry {
			t.Fatalf("step %d: got allowed=%v wait=%v retry=%v, want %v %v %v", i, res.Allowed, res.Wait, res.RetryAfter, s.allowed, s.wait, s.retry)
		}
	}
}

// TestPriorityBounds drives random traffic of three classes over random
// limits and checks the stated bounds: a booking of a class with reserve R
// and horizon D leaves every limit's debt at most (Burst-R)*T + D; a take
// of a higher class (reserve r, n <= R-r) that finds only bookings of the
// class waits at most D - (R-r-n)*T; and over all classes together the
// bucket's window bound holds (no more than Burst + rate x window).
func TestPriorityBounds(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	type class struct {
		reserve int64
		horizon time.Duration
	}
	for trial := range 400 {
		lims := []fleetrate.Limit{fleetrate.PerSecond(float64(1+rng.IntN(1000)), int64(3+rng.IntN(60)))}
		if rng.IntN(2) == 0 {
			l0 := lims[0]
			lims = append(lims, fleetrate.PerSecond(l0.Rate/float64(1+rng.IntN(4)), l0.Burst+int64(rng.IntN(20))))
		}
		minBurst := lims[0].Burst
		for _, l := range lims {
			minBurst = min(minBurst, l.Burst)
		}
		iv0 := lims[0].Interval()
		// Class 0 is the top; reserves grow down the classes.
		r1 := 1 + rng.Int64N(minBurst-1)
		r2 := r1 + rng.Int64N(minBurst-r1)
		classes := []class{
			{0, time.Duration(rng.Int64N(int64(lims[0].FillTime()) + 1))},
			{r1, time.Duration(rng.Int64N(3 * iv0))},
			{r2, time.Duration(rng.Int64N(3 * iv0))},
		}
		takeOf := func(c int) fleetrate.Request {
			cl := classes[c]
			n := 1 + rng.Int64N(minBurst-cl.reserve)
			return take(fleetrate.Bucket{Key: "k", Limits: lims, Reserve: cl.reserve}, n, cl.horizon)
		}
		st := []State{{}}
		now := int64(1_700_000_000) * sec
		type grant struct{ at, n int64 }
		var grants []grant
		step := func(c int, req fleetrate.Request) fleetrate.Result {
			res, _ := Decide(now, req, st)
			if res.Allowed && req.N > 0 {
				grants = append(grants, grant{now*1000 + int64(res.Wait), req.N})
				cl := classes[c]
				for i, l := range lims {
					if bound := (l.Burst-cl.reserve)*l.Interval() + int64(cl.horizon); st[0].Debts[i] > bound {
						t.Fatalf("trial %d: class %d booking left debt %d > (B-R)T+D = %d", trial, c, st[0].Debts[i], bound)
					}
				}
			}
			return res
		}
		for range 20 {
			// A run of one lower class alone, then a take of a higher one.
			low := 1 + rng.IntN(2)
			for range rng.IntN(40) {
				now += rng.Int64N(iv0/1000/int64(1+rng.IntN(8)) + 1)
				step(low, takeOf(low))
			}
			now += rng.Int64N(iv0/1000 + 1)
			hc := rng.IntN(low)
			req := takeOf(hc)
			if req.N > classes[low].reserve-classes[hc].reserve {
				req.N = classes[low].reserve - classes[hc].reserve
			}
			if req.N < 1 {
				continue
			}
			res := step(hc, req)
			lc := classes[low]
			bound := max(int64(lc.horizon)-(lc.reserve-classes[hc].reserve-req.N)*iv0, 0)
			if len(lims) == 1 && (res.Allowed && int64(res.Wait) > bound || !res.Allowed && bound <= int64(req.MaxWait)) {
				t.Fatalf("trial %d: class %d take of %d waited %v behind class %d (R=%d D=%v), bound %v",
					trial, hc, req.N, res.Wait, low, lc.reserve, lc.horizon, time.Duration(bound))
			}
			// Mixed traffic of every class, then let the bucket refill.
			for range rng.IntN(30) {
				now += rng.Int64N(iv0/1000/int64(1+rng.IntN(8)) + 1)
				c := rng.IntN(len(classes))
				step(c, takeOf(c))
			}
			now += int64(lims[len(lims)-1].FillTime()/time.Microsecond) + int64(classes[0].horizon/time.Microsecond) + 1
		}
		slices.SortFunc(grants, func(a, b grant) int { return cmp.Compare(a.at, b.at) })
		for _, l := range lims {
			for i := range grants {
				sum := int64(0)
				for j := i; j < len(grants); j++ {
					sum += grants[j].n
					if w := grants[j].at - grants[i].at; sum > l.Burst+w/l.Interval() {
						t.Fatalf("trial %d %v: %d tokens in %d ns", trial, l, sum, w)
					}
				}
			}
		}
	}
}
