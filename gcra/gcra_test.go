package gcra

import (
	"context"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

const sec = int64(time.Second / time.Microsecond) // one second in µs

func take(b fleetrate.Bucket, n int64, maxWait time.Duration) fleetrate.Request {
	return fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: n, MaxWait: maxWait}
}

// TestDecideTimeline pins the algorithm down on a fixed timeline.
func TestDecideTimeline(t *testing.T) {
	t.Parallel()
	b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 3)}} // 100 ms per token
	t0 := int64(1_700_000_000) * sec
	type step struct {
		at      int64 // µs after t0
		n       int64
		maxWait time.Duration
		allowed bool
		rem     int64
		wait    time.Duration
		retry   time.Duration
		reset   time.Duration
	}
	steps := []step{
		{at: 0, n: 1, allowed: true, rem: 2, reset: 100 * time.Millisecond},
		{at: 0, n: 2, allowed: true, rem: 0, reset: 300 * time.Millisecond},
		{at: 0, n: 1, allowed: false, rem: 0, retry: 100 * time.Millisecond, reset: 300 * time.Millisecond},
		{at: 50_000, n: 1, allowed: false, rem: 0, retry: 50 * time.Millisecond, reset: 250 * time.Millisecond},
		{at: 100_000, n: 1, allowed: true, rem: 0, reset: 300 * time.Millisecond},
		{at: 100_000, n: 0, allowed: true, rem: 0, reset: 300 * time.Millisecond}, // peek
		// Reserve: book 2 tokens ahead with a max wait of 250 ms.
		{at: 100_000, n: 2, maxWait: 250 * time.Millisecond, allowed: true, rem: 0, wait: 200 * time.Millisecond, reset: 500 * time.Millisecond},
		{at: 100_000, n: 1, maxWait: 250 * time.Millisecond, allowed: false, rem: 0, retry: 300 * time.Millisecond, reset: 500 * time.Millisecond},
		{at: 100_000, n: 0, allowed: false, rem: 0, retry: 200 * time.Millisecond, reset: 500 * time.Millisecond}, // peek in debt
		// 10 s later the bucket is full again.
		{at: 10 * sec, n: 3, allowed: true, rem: 0, reset: 300 * time.Millisecond},
		{at: 10*sec + 1, n: 0, allowed: true, rem: 0, reset: 299_999 * time.Microsecond},
	}
	var st []State
	st = append(st, State{})
	for i, s := range steps {
		res, _ := Decide(t0+s.at, take(b, s.n, s.maxWait), st)
		if res.Allowed != s.allowed || res.Remaining != s.rem || res.Wait != s.wait || res.RetryAfter != s.retry || res.ResetAfter != s.reset {
			t.Fatalf("step %d: got allowed=%v rem=%d wait=%v retry=%v reset=%v, want %v %d %v %v %v",
				i, res.Allowed, res.Remaining, res.Wait, res.RetryAfter, res.ResetAfter, s.allowed, s.rem, s.wait, s.retry, s.reset)
		}
	}
}

// TestMultiLimitBooksAtGrant checks that a limit delayed by another limit is
// booked at the actual grant time, so neither limit is exceeded.
func TestMultiLimitBooksAtGrant(t *testing.T) {
	t.Parallel()
	fast := fleetrate.PerSecond(100, 1).Named("fast")
	slow := fleetrate.PerSecond(1, 1).Named("slow")
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "k", Limits: []fleetrate.Limit{fast, slow}}}, N: 1, MaxWait: 10 * time.Second}
	st := []State{{}}
	var grants []time.Duration
	for range 3 {
		res, _ := Decide(0, req, st)
		if !res.Allowed {
			t.Fatalf("denied: %+v", res)
		}
		grants = append(grants, res.Wait)
	}
	want := []time.Duration{0, time.Second, 2 * time.Second}
	for i := range want {
		if grants[i] != want[i] {
			t.Fatalf("grant %d at %v, want %v", i, grants[i], want[i])
		}
	}
}

func TestDecideDeniedNamesLimitAndBucket(t *testing.T) {
	t.Parallel()
	a := fleetrate.Bucket{Key: "a", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 10).Named("roomy")}}
	b := fleetrate.Bucket{Key: "b", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 10).Named("sec"), fleetrate.PerPeriod(1, time.Minute).Named("minute")}}
	st := []State{{}, {}}
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{a, b}, N: 1}
	if res, _ := Decide(0, req, st); !res.Allowed || res.Limit.Name != "minute" || res.Bucket != 1 {
		t.Fatalf("first take: %+v", res)
	}
	res, changed := Decide(0, req, st)
	if res.Allowed || changed || res.Limit.Name != "minute" || res.Bucket != 1 || res.RetryAfter != time.Minute {
		t.Fatalf("second take: %+v changed=%v", res, changed)
	}
	// Nothing was taken from a by the denied take.
	if rem, _, _ := status(a.Limits, st[0].Debts); rem != 9 {
		t.Fatalf("a remaining %d, want 9", rem)
	}
}

func TestRefundAndDrain(t *testing.T) {
	t.Parallel()
	l := []fleetrate.Limit{fleetrate.PerSecond(10, 5)}
	s := State{}
	req := take(fleetrate.Bucket{Key: "k", Limits: l}, 5, 0)
	sts := []State{s}
	Decide(0, req, sts)
	Refund(0, l, &sts[0], 3, 0, 0)
	if rem, _, _ := status(l, sts[0].Debts); rem != 3 {
		t.Fatalf("after refund remaining %d, want 3", rem)
	}
	Refund(0, l, &sts[0], 100, 0, 0)
	if sts[0].Debts[0] != 0 {
		t.Fatalf("refund overfilled: %v", sts[0].Debts)
	}
	// A refund so large that n*T overflows int64 still just fills the bucket.
	Decide(0, req, sts)
	Refund(0, l, &sts[0], 1<<62, 0, 0)
	if sts[0].Debts[0] != 0 {
		t.Fatalf("huge refund: debts %v, want a full bucket", sts[0].Debts)
	}
	Drain(0, l, &sts[0], 2*time.Second, false)
	res, _ := Decide(sec, take(fleetrate.Bucket{Key: "k", Limits: l}, 1, 0), sts)
	if res.Allowed || res.RetryAfter != time.Second+100*time.Millisecond {
		t.Fatalf("during drain: %+v", res)
	}
	// Right after the drain ends the bucket is empty and refills at rate.
	res, _ = Decide(2*sec+100_000, take(fleetrate.Bucket{Key: "k", Limits: l}, 1, 0), sts)
	if !res.Allowed || res.Remaining != 0 {
		t.Fatalf("after drain: %+v", res)
	}
	// A drain never shortens a debt; a void one does: the bucket is empty
	// until its end and no longer.
	Drain(3*sec, l, &sts[0], 10*time.Second, false)
	Drain(3*sec, l, &sts[0], time.Second, false)
	if res, _ := Decide(4*sec+200_000, take(fleetrate.Bucket{Key: "k", Limits: l}, 1, 0), sts); res.Allowed {
		t.Fatalf("a shorter drain shortened a longer one: %+v", res)
	}
	Drain(4*sec+200_000, l, &sts[0], time.Second, true)
	if res, _ := Decide(5*sec+300_000, take(fleetrate.Bucket{Key: "k", Limits: l}, 1, 0), sts); !res.Allowed {
		t.Fatalf("after a void drain of 1 s, 1.1 s later: %+v, want allowed", res)
	}
}

func TestElapseClockBackwards(t *testing.T) {
	t.Parallel()
	s := State{Stamp: 10 * sec, Debts: []int64{5e8}}
	s.Elapse(9*sec, []fleetrate.Limit{fleetrate.PerSecond(10, 5)})
	if s.Debts[0] != 5e8 {
		t.Fatalf("clock going backwards changed debt: %v", s.Debts)
	}
}

// TestWindowBound checks the exact token-bucket guarantee on random
// traffic: in every window between two grants, the tokens granted are at
// most burst + rate × window.
func TestWindowBound(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		lim := fleetrate.PerSecond(float64(1+rng.IntN(1000)), int64(1+rng.IntN(50)))
		b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{lim}}
		st := []State{{}}
		now := int64(0)
		type grant struct{ at, n int64 } // at in ns
		var grants []grant
		for range 400 {
			now += rng.Int64N(3*lim.Interval()/1000/max(1, int64(rng.IntN(4))) + 1)
			n := 1 + rng.Int64N(lim.Burst)
			mw := time.Duration(0)
			if rng.IntN(2) == 0 {
				mw = time.Duration(rng.Int64N(int64(lim.FillTime()) + 1))
			}
			res, _ := Decide(now, take(b, n, mw), st)
			if res.Allowed {
				grants = append(grants, grant{now*1000 + int64(res.Wait), n})
			}
		}
		// Grants may be booked out of order; sort by time.
		sortGrants := func() {
			for i := 1; i < len(grants); i++ {
				for j := i; j > 0 && grants[j].at < grants[j-1].at; j-- {
					grants[j], grants[j-1] = grants[j-1], grants[j]
				}
			}
		}
		sortGrants()
		for i := range grants {
			sum := int64(0)
			for j := i; j < len(grants); j++ {
				sum += grants[j].n
				window := float64(grants[j].at-grants[i].at) / 1e9
				if float64(sum) > float64(lim.Burst)+lim.Rate*window {
					t.Fatalf("trial %d %v: %d tokens in %.9fs window", trial, lim, sum, window)
				}
			}
		}
	}
}

// TestDecideOneMatchesDecide holds the single-limit fast path to the
// general algorithm on random limits, states and requests.
func TestDecideOneMatchesDecide(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 20_000 {
		lim := fleetrate.Limit{Name: "l", Rate: float64(rng.IntN(1_000_000) + 1), Burst: rng.Int64N(100) + 1}
		if lim.Validate() != nil {
			continue
		}
		if rng.IntN(2) == 0 {
			lim = compiled(lim)
		}
		b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{lim}}
		now := int64(1_700_000_000)*sec + rng.Int64N(10*sec)
		var st State
		switch rng.IntN(4) {
		case 0: // absent
		case 1: // limits changed
			st = State{Stamp: now - rng.Int64N(sec), Debts: []int64{1, 2}}
		default:
			st = State{Stamp: now - rng.Int64N(2*sec) + sec/2, Debts: []int64{rng.Int64N(lim.Burst*lim.Interval()*2+1) - 1000}}
		}
		n := rng.Int64N(lim.Burst + 1)
		maxWait := time.Duration(rng.Int64N(int64(lim.FillTime()) + 1))
		if rng.IntN(2) == 0 {
			maxWait = 0
		}
		clone := func() State {
			return State{Stamp: st.Stamp, Debts: append([]int64(nil), st.Debts...)}
		}
		// With a reserve, Decide's fast path against decide.
		if rb := b; n < lim.Burst && rng.IntN(3) == 0 {
			rb.Reserve = rng.Int64N(lim.Burst - n)
			ref, fast := []State{clone()}, []State{clone()}
			want, wantChanged := decide(now, take(rb, n, maxWait), ref)
			got, changed := Decide(now, take(rb, n, maxWait), fast)
			if !reflect.DeepEqual(got, want) || changed != wantChanged || fast[0].Stamp != ref[0].Stamp || fast[0].Debts[0] != ref[0].Debts[0] {
				t.Fatalf("trial %d: reserve %d: Decide %+v %v %+v, want %+v %v %+v", trial, rb.Reserve, got, changed, fast[0], want, wantChanged, ref[0])
			}
		}
		ref := []State{clone()}
		want, wantChanged := decide(now, take(b, n, maxWait), ref)

		fast := []State{clone()}
		got, changed := Decide(now, take(b, n, maxWait), fast)
		if !reflect.DeepEqual(got, want) || changed != wantChanged || fast[0].Stamp != ref[0].Stamp || fast[0].Debts[0] != ref[0].Debts[0] {
			t.Fatalf("trial %d: Decide %+v %v %+v, want %+v %v %+v", trial, got, changed, fast[0], want, wantChanged, ref[0])
		}
		one := clone()
		res := fleetrate.Result{Allowed: true, Bucket: 7, Degraded: true} // overwritten
		changed = DecideOne(now, b.Limits, n, maxWait, &one, &res)
		if !reflect.DeepEqual(res, want) || changed != wantChanged || one.Stamp != ref[0].Stamp || one.Debts[0] != ref[0].Debts[0] {
			t.Fatalf("trial %d: DecideOne %+v %v %+v, want %+v %v %+v", trial, res, changed, one, want, wantChanged, ref[0])
		}
		if got.Limit != (fleetrate.Limit{Name: lim.Name, Rate: lim.Rate, Burst: lim.Burst}) {
			t.Fatalf("trial %d: result limit %+v carries the cache", trial, got.Limit)
		}
	}
}

// TestDecideOneSeveralLimits checks DecideOne on a bucket with several
// limits against Decide.
func TestDecideOneSeveralLimits(t *testing.T) {
	t.Parallel()
	limits := []fleetrate.Limit{compiled(fleetrate.PerSecond(10, 3)), fleetrate.Every(time.Minute, 5)}
	now := int64(1_700_000_000) * sec
	ref, one := []State{{}}, State{}
	for i := range 12 {
		req := take(fleetrate.Bucket{Key: "k", Limits: limits}, int64(i%3), time.Duration(i%2)*time.Minute)
		want, wantChanged := Decide(now, req, ref)
		var got fleetrate.Result
		changed := DecideOne(now, limits, req.N, req.MaxWait, &one, &got)
		if !reflect.DeepEqual(got, want) || changed != wantChanged || one.Stamp != ref[0].Stamp || !slices.Equal(one.Debts, ref[0].Debts) {
			t.Fatalf("step %d: DecideOne %+v %v %+v, want %+v %v %+v", i, got, changed, one, want, wantChanged, ref[0])
		}
		now += 40_000
	}
}

// capture is a Store that keeps the last request it was given.
type capture struct {
	fleetrate.Store
	req fleetrate.Request
}

func (c *capture) Take(_ context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	c.req = req
	c.req.Buckets = slices.Clone(req.Buckets) // the Limiter reuses its slice
	return fleetrate.Result{}, nil
}

// compiled returns l as a Limiter hands it to its store, with its interval
// cached: the hot path's limits.
func compiled(l fleetrate.Limit) fleetrate.Limit {
	c := &capture{}
	lim, err := fleetrate.New(c, fleetrate.Config{Limits: []fleetrate.Limit{l}})
	if err != nil {
		panic(err)
	}
	_, _ = lim.AllowN(context.Background(), 1, "k")
	return c.req.Buckets[0].Limits[0]
}

// TestDecidingLimit checks that a result names the limit that decided by
// its index and says when that limit gains its next token.
func TestDecidingLimit(t *testing.T) {
	t.Parallel()
	t0 := int64(1_700_000_000) * sec
	fast := fleetrate.PerSecond(10, 10)     // 100 ms per token
	slow := fleetrate.Every(time.Minute, 2) // 1 min per token
	one := fleetrate.Bucket{Key: "one", Limits: []fleetrate.Limit{fleetrate.Every(time.Second, 3)}}
	two := fleetrate.Bucket{Key: "two", Limits: []fleetrate.Limit{fast, slow}}
	for _, tc := range []struct {
		name      string
		b         fleetrate.Bucket
		takes     []int64 // at t0
		peekAt    int64   // µs after t0
		wantIndex int
		wantNext  time.Duration
	}{
		{"full bucket", one, nil, 0, 0, time.Second},
		{"one token used", one, []int64{1}, 0, 0, time.Second},
		{"part of a token back", one, []int64{2}, 400_000, 0, 600 * time.Millisecond},
		{"in debt", one, []int64{3}, 0, 0, time.Second},
		{"tightest of two", two, []int64{1}, 0, 1, time.Minute},
		{"tightest of two later", two, []int64{1}, 15 * sec, 1, 45 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := []State{{}}
			for _, n := range tc.takes {
				Decide(t0, take(tc.b, n, 0), st)
			}
			res, _ := Decide(t0+tc.peekAt, take(tc.b, 0, 0), st)
			if res.LimitIndex != tc.wantIndex || res.NextToken != tc.wantNext {
				t.Errorf("limit %d, next token in %v; want %d, %v", res.LimitIndex, res.NextToken, tc.wantIndex, tc.wantNext)
			}
		})
	}
	// A refusal names the limit that refused, not the tightest one.
	st := []State{{}}
	Decide(t0, take(two, 2, 0), st)
	res, _ := Decide(t0, take(two, 1, 0), st)
	if res.Allowed || res.LimitIndex != 1 || res.NextToken != time.Minute {
		t.Errorf("refusal: allowed %v, limit %d, next token in %v; want false, 1, 1m0s", res.Allowed, res.LimitIndex, res.NextToken)
	}
}

// TestConfigurationsInTurn drives one bucket from two configurations of
// its limits, as two processes configured apart during a rolling reload:
// the same 10/s with bursts 100 and 10. Neither may grant more than the
// looser allows alone (burst + rate × time): takes under the short fill
// with idle time between them refill the bucket at the short fill's pace,
// which must not be the long one's to spend (a whole burst every cycle,
// before: see State.Anchor).
func TestConfigurationsInTurn(t *testing.T) {
	// Two takes a second apart under the short fill, the second refilling
	// at its own pace; and one take followed by two idle seconds, after
	// which the short fill's bucket is full (a store would hold no state).
	for _, idle := range [][]int64{{1_000_000, 1_000_000}, {2_000_000}} {
		configurationsInTurn(t, idle)
	}
}

func configurationsInTurn(t *testing.T, idle []int64) {
	long := []fleetrate.Limit{fleetrate.PerSecond(10, 100)}
	short := []fleetrate.Limit{fleetrate.PerSecond(10, 10)}
	var st State
	now := int64(1_000_000_000)
	take := func(limits []fleetrate.Limit) bool {
		var res fleetrate.Result
		cp := st.Clone()
		if DecideOne(now, limits, 1, 0, &cp, &res) {
			st = cp // a take that books nothing writes nothing
			return true
		}
		return false
	}
	start, granted := now, 0
	for range 100 {
		if take(long) {
			granted++
		}
	}
	for range 5 {
		for _, d := range idle {
			now += 1_000_000
			if take(short) {
				granted++
			}
			now += d - 1_000_000
		}
		now += 1_000_000
		for range 120 {
			if take(long) {
				granted++
			}
		}
	}
	el := float64(now-start) / 1e6
	if bound := 100 + 10*el; float64(granted) > bound {
		t.Fatalf("idle %v: granted %d in %.0f s, want at most %.0f (burst 100 + 10/s)", idle, granted, el, bound)
	}
}

// TestLimitsCarriedOver: a limit kept keeps its debt wherever it moves in
// the list, a limit added starts full, and a state written for other
// limits is never read as a full bucket.
func TestLimitsCarriedOver(t *testing.T) {
	sec := fleetrate.PerSecond(10, 10)
	day := fleetrate.PerPeriod(1000, 24*time.Hour)
	now := int64(1_000_000_000)
	st := State{}
	st.Elapse(now, []fleetrate.Limit{sec, day})
	st.Debts[0], st.Debts[1] = 500_000_000, 86_400_000_000 // half of sec, a tenth of day
	for _, tc := range []struct {
		name   string
		limits []fleetrate.Limit
		want   []int64
	}{
		{"reordered", []fleetrate.Limit{day, sec}, []int64{86_400_000_000, 500_000_000}},
		{"day removed", []fleetrate.Limit{sec}, []int64{500_000_000}},
		{"sec halved: the same fraction", []fleetrate.Limit{fleetrate.PerSecond(5, 10), day}, []int64{1_000_000_000, 86_400_000_000}},
		{"a limit added starts full", []fleetrate.Limit{sec, fleetrate.PerPeriod(100, time.Minute), day}, []int64{500_000_000, 0, 86_400_000_000}},
	} {
		got := st.Clone()
		got.Elapse(now, tc.limits)
		if !slices.Equal(got.Debts, tc.want) {
			t.Errorf("%s: debts %v, want %v", tc.name, got.Debts, tc.want)
		}
		if got.Converts(tc.limits) {
			t.Errorf("%s: still converts after Elapse", tc.name)
		}
	}
}

// TestCancelHugeN: giving back more tokens than were booked empties the
// debt, and never overflows n × interval into a debt of centuries.
func TestCancelHugeN(t *testing.T) {
	lim := []fleetrate.Limit{fleetrate.PerSecond(1, 2)}
	now := int64(1_000_000_000)
	var st State
	var res fleetrate.Result
	DecideOne(now, lim, 1, 0, &st, &res)
	booked := slices.Clone(st.Debts)
	if !Cancel(now, lim, &st, fleetrate.MaxBurst, now, booked, math.MaxInt64) || st.Debts[0] != 0 {
		t.Fatalf("after cancelling MaxBurst tokens: debts %v, want 0", st.Debts)
	}
}

// TestRefundOnlyWhatTimeHasNotRefilled replays the case a black-box check
// found: 1/s burst 3; A takes 3 at 0 and does not use them; at 3 s, when
// the bucket is full again, B takes 3 and uses them; then A's refund must
// not give the bucket 3 more, or C gets 3 at the same instant as B.
func TestRefundOnlyWhatTimeHasNotRefilled(t *testing.T) {
	t.Parallel()
	l := []fleetrate.Limit{fleetrate.PerSecond(1, 3)}
	b := fleetrate.Bucket{Key: "k", Limits: l}
	sts := []State{{}}
	a, _ := Decide(0, take(b, 3, 0), sts)
	if r, _ := Decide(3*sec, take(b, 3, 0), sts); !r.Allowed {
		t.Fatalf("B at 3 s: %+v", r)
	}
	Refund(3*sec, l, &sts[0], 3, a.At.UnixMicro(), 0)
	if r, _ := Decide(3*sec, take(b, 1, 0), sts); r.Allowed {
		t.Fatalf("C at 3 s got a token the refund gave twice: %+v", r)
	}
	// Refunded 1 s after its grant, on an otherwise idle bucket, a grant
	// of 3 gets back the 2 that time has not refilled: the bucket is then
	// exactly as full as if the grant had never been made.
	sts = []State{{}}
	g, _ := Decide(10*sec, take(b, 3, 0), sts)
	Refund(11*sec, l, &sts[0], 3, g.At.UnixMicro(), 0)
	if r, _ := Decide(11*sec, take(b, 0, 0), sts); r.Remaining != 3 {
		t.Fatalf("1 s after a grant of 3 on an idle bucket: %d left, want 3", r.Remaining)
	}
	// A grant dated centuries ago (a caller's mistake): no overflow,
	// nothing back. A refund of more than a burst gives back what the
	// bucket owes at most.
	sts = []State{{}}
	Decide(20*sec, take(b, 3, 0), sts)
	if Refund(20*sec, l, &sts[0], 3, time.Date(1000, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(), 0) {
		t.Fatal("a refund of a grant from the year 1000 gave tokens back")
	}
	Refund(20*sec, l, &sts[0], fleetrate.MaxBurst, 20*sec, 0)
	if sts[0].Debts[0] != 0 {
		t.Fatalf("a refund of MaxBurst tokens left debt %d, want a full bucket", sts[0].Debts[0])
	}
}

// TestRefundLeavesBookingsAhead: while a slot is booked ahead (or the
// bucket is drained, or a reserve's slot lies ahead), a refund gives back
// nothing: a later take would be granted a slot before the booked one.
func TestRefundLeavesBookingsAhead(t *testing.T) {
	t.Parallel()
	l := []fleetrate.Limit{fleetrate.PerSecond(1, 3)}
	b := fleetrate.Bucket{Key: "k", Limits: l}
	sts := []State{{}}
	g, _ := Decide(0, take(b, 3, 0), sts)
	if r, _ := Decide(0, take(b, 1, 2*time.Second), sts); !r.Allowed || r.Wait != time.Second {
		t.Fatalf("booking ahead: %+v", r)
	}
	if Refund(0, l, &sts[0], 3, g.At.UnixMicro(), 0) {
		t.Fatal("refund changed a bucket with a slot booked ahead")
	}
	// A reserve of 1: a lower class books ahead while the bucket holds
	// less than 1 token beyond its take, so a debt above 2 tokens may
	// hide a booked slot.
	sts = []State{{}}
	g, _ = Decide(0, take(b, 3, 0), sts)
	Refund(500_000, l, &sts[0], 1, g.At.UnixMicro(), 1) // debt 2.5 tokens
	if sts[0].Debts[0] != 2_500_000_000 {
		t.Fatalf("refund with reserve 1 at a debt of 2.5 tokens changed it to %d", sts[0].Debts[0])
	}
	// At a debt of 1.5 tokens no slot can lie ahead: of the grant's 3
	// tokens, the 1.5 that time has not refilled go back.
	Refund(1_500_000, l, &sts[0], 3, g.At.UnixMicro(), 1)
	if sts[0].Debts[0] != 0 {
		t.Fatalf("refund of 3 granted 1.5 s ago at a debt of 1.5 tokens left debt %d, want 0", sts[0].Debts[0])
	}
}

// TestCancelAfterSlotBegan: once a booking's slot has begun, its caller
// may have acted, so Cancel gives nothing back (x/time/rate's Cancel
// restores nothing after its time to act); before it, everything.
func TestCancelAfterSlotBegan(t *testing.T) {
	t.Parallel()
	l := []fleetrate.Limit{fleetrate.PerSecond(10, 1)}
	b := fleetrate.Bucket{Key: "k", Limits: l}
	for _, c := range []struct {
		at   int64 // µs after the booking
		back bool
	}{{0, true}, {50_000, true}, {100_000, true}, {100_001, false}, {2 * sec, false}} {
		sts := []State{{}}
		Decide(0, take(b, 1, 0), sts) // the slot at 0 is taken
		req := take(b, 1, time.Second)
		bk := &fleetrate.Booking{}
		req.Booking = bk
		r, _ := Decide(0, req, sts) // the slot at 100 ms
		if r.Wait != 100*time.Millisecond {
			t.Fatalf("wait %v, want 100ms", r.Wait)
		}
		if w := BookedWait([]fleetrate.Bucket{b}, bk.Debts); w != int64(r.Wait) {
			t.Fatalf("BookedWait = %d, want the take's wait %d", w, r.Wait)
		}
		got := Cancel(c.at, l, &sts[0], 1, bk.Stamp, bk.Debts, BookedWait([]fleetrate.Bucket{b}, bk.Debts))
		if got != c.back {
			t.Errorf("cancel %d µs after a booking whose slot is at 100 ms: gave back %v, want %v", c.at, got, c.back)
		}
	}
}
