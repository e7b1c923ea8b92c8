package fleetrate

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

const sec = int64(time.Second / time.Microsecond) // one second in µs

func take(b Bucket, n int64, maxWait time.Duration) Request {
	return Request{Buckets: []Bucket{b}, N: n, MaxWait: maxWait}
}

// TestDecideTimeline pins the algorithm down on a fixed timeline.
func TestDecideTimeline(t *testing.T) {
	t.Parallel()
	b := Bucket{Key: "k", Limits: []Limit{PerSecond(10, 3)}} // 100 ms per token
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
	var st []BucketState
	st = append(st, BucketState{})
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
	fast := PerSecond(100, 1).Named("fast")
	slow := PerSecond(1, 1).Named("slow")
	req := Request{Buckets: []Bucket{{Key: "k", Limits: []Limit{fast, slow}}}, N: 1, MaxWait: 10 * time.Second}
	st := []BucketState{{}}
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
	a := Bucket{Key: "a", Limits: []Limit{PerSecond(1, 10).Named("roomy")}}
	b := Bucket{Key: "b", Limits: []Limit{PerSecond(1, 10).Named("sec"), PerPeriod(1, time.Minute).Named("minute")}}
	st := []BucketState{{}, {}}
	req := Request{Buckets: []Bucket{a, b}, N: 1}
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
	l := []Limit{PerSecond(10, 5)}
	s := BucketState{}
	req := take(Bucket{Key: "k", Limits: l}, 5, 0)
	sts := []BucketState{s}
	Decide(0, req, sts)
	Refund(0, l, &sts[0], 3)
	if rem, _, _ := status(l, sts[0].Debts); rem != 3 {
		t.Fatalf("after refund remaining %d, want 3", rem)
	}
	Refund(0, l, &sts[0], 100)
	if sts[0].Debts[0] != 0 {
		t.Fatalf("refund overfilled: %v", sts[0].Debts)
	}
	// A refund so large that n*T overflows int64 still just fills the bucket.
	Decide(0, req, sts)
	Refund(0, l, &sts[0], 1<<62)
	if sts[0].Debts[0] != 0 {
		t.Fatalf("huge refund: debts %v, want a full bucket", sts[0].Debts)
	}
	Drain(0, l, &sts[0], 2*time.Second)
	res, _ := Decide(sec, take(Bucket{Key: "k", Limits: l}, 1, 0), sts)
	if res.Allowed || res.RetryAfter != time.Second+100*time.Millisecond {
		t.Fatalf("during drain: %+v", res)
	}
	// Right after the drain ends the bucket is empty and refills at rate.
	res, _ = Decide(2*sec+100_000, take(Bucket{Key: "k", Limits: l}, 1, 0), sts)
	if !res.Allowed || res.Remaining != 0 {
		t.Fatalf("after drain: %+v", res)
	}
}

func TestElapseClockBackwards(t *testing.T) {
	t.Parallel()
	s := BucketState{Stamp: 10 * sec, Debts: []int64{5e8}}
	s.Elapse(9*sec, 1)
	if s.Debts[0] != 5e8 {
		t.Fatalf("clock going backwards changed debt: %v", s.Debts)
	}
}

func TestLimitValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		l    Limit
		want string
	}{
		{"zero rate", Limit{Rate: 0, Burst: 1}, "rate must be positive and finite, got 0"},
		{"negative rate", Limit{Rate: -1, Burst: 1}, "got -1"},
		{"nan", Limit{Rate: math.NaN(), Burst: 1}, "got NaN"},
		{"inf", Limit{Rate: math.Inf(1), Burst: 1}, "got +Inf"},
		{"too fast", Limit{Rate: 2e9, Burst: 1}, "rate must be at most"},
		{"burst 0", Limit{Rate: 1, Burst: 0}, "burst must be at least 1, got 0"},
		{"fill too long", Limit{Rate: 1.0 / 3600, Burst: 10000}, "time to fill"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.l.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want error containing %q", err, c.want)
			}
		})
	}
	for _, ok := range []Limit{PerSecond(1e6, 1), PerSecond(1e9, 1), Every(time.Hour, 24), PerPeriod(100, time.Minute)} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
}

func TestInterval(t *testing.T) {
	t.Parallel()
	cases := []struct {
		l    Limit
		want int64
	}{
		{PerSecond(1e6, 1), 1000},
		{PerSecond(3, 1), 333_333_334},
		{PerPeriod(100, time.Minute), 600_000_000},
		{Every(time.Hour, 1), int64(time.Hour)},
		{PerSecond(7e5, 1), 1429},
		{PerSecond(1e9, 1), 1},
	}
	for _, c := range cases {
		if got := c.l.Interval(); got != c.want {
			t.Errorf("%v interval = %d, want %d", c.l, got, c.want)
		}
	}
	// Whatever the rate, the interval never grants faster than it.
	for _, l := range []Limit{PerPeriod(7, 60*24*time.Hour), PerSecond(1.0/3, 1), PerSecond(999_999.7, 1), PerPeriod(13, time.Hour)} {
		if iv := l.Interval(); float64(time.Second)/float64(iv) > l.Rate {
			t.Errorf("%v: interval %d ns grants %v/s, faster than the rate", l, iv, float64(time.Second)/float64(iv))
		}
	}
}

func TestRequestValidate(t *testing.T) {
	t.Parallel()
	b := Bucket{Key: "k", Limits: []Limit{PerSecond(1, 2)}}
	if err := (Request{Buckets: []Bucket{b}, N: 3}).Validate(); !errors.Is(err, ErrBurstExceeded) {
		t.Fatalf("n > burst: %v", err)
	}
	if err := (Request{Buckets: []Bucket{b}, N: -1}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("n < 0: %v", err)
	}
	if err := (Request{Buckets: []Bucket{b, b}, N: 1}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("duplicate key: %v", err)
	}
	split := []Bucket{{Prefix: "a", Key: "bc", Limits: b.Limits}, {Prefix: "ab", Key: "c", Limits: b.Limits}}
	if err := (Request{Buckets: split, N: 1}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("the same store key split two ways: %v", err)
	}
	if err := (Request{Buckets: []Bucket{{Key: "", Limits: b.Limits}}}).Validate(); err == nil || !strings.Contains(err.Error(), "buckets[0].key") {
		t.Fatalf("empty key: %v", err)
	}
}

// TestWindowBound checks the exact token-bucket guarantee on random
// traffic: in every window between two grants, the tokens granted are at
// most burst + rate × window.
func TestWindowBound(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 50 {
		lim := PerSecond(float64(1+rng.IntN(1000)), int64(1+rng.IntN(50)))
		b := Bucket{Key: "k", Limits: []Limit{lim}}
		st := []BucketState{{}}
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

// TestCompiledLimitFollowsChanges checks that a Limiter's cached interval
// never outlives a change of the limit's Rate or Burst.
func TestCompiledLimitFollowsChanges(t *testing.T) {
	t.Parallel()
	l := PerSecond(10, 5).compiled()
	if l.Interval() != 100_000_000 || l.Validate() != nil {
		t.Fatalf("compiled %v: interval %d, %v", l, l.Interval(), l.Validate())
	}
	l.Rate = 1000
	if got := l.Interval(); got != 1_000_000 {
		t.Fatalf("after changing the rate the interval is %d, want 1000000", got)
	}
	l.Rate = 0
	if l.Validate() == nil {
		t.Fatal("a compiled limit changed to rate 0 still validates")
	}
	l = PerSecond(10, 5).compiled()
	l.Burst = 0
	if l.Validate() == nil {
		t.Fatal("a compiled limit changed to burst 0 still validates")
	}
	if p := PerSecond(10, 5).compiled().plain(); p != PerSecond(10, 5) {
		t.Fatalf("plain() = %+v, want the limit as callers built it", p)
	}
}

// TestDecideOneMatchesDecide holds the single-limit fast path to the
// general algorithm on random limits, states and requests.
func TestDecideOneMatchesDecide(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 20_000 {
		lim := Limit{Name: "l", Rate: float64(rng.IntN(1_000_000) + 1), Burst: rng.Int64N(100) + 1}
		if lim.Validate() != nil {
			continue
		}
		if rng.IntN(2) == 0 {
			lim = lim.compiled()
		}
		b := Bucket{Key: "k", Limits: []Limit{lim}}
		now := int64(1_700_000_000)*sec + rng.Int64N(10*sec)
		var st BucketState
		switch rng.IntN(4) {
		case 0: // absent
		case 1: // limits changed
			st = BucketState{Stamp: now - rng.Int64N(sec), Debts: []int64{1, 2}}
		default:
			st = BucketState{Stamp: now - rng.Int64N(2*sec) + sec/2, Debts: []int64{rng.Int64N(lim.Burst*lim.Interval()*2+1) - 1000}}
		}
		n := rng.Int64N(lim.Burst + 1)
		maxWait := time.Duration(rng.Int64N(int64(lim.FillTime()) + 1))
		if rng.IntN(2) == 0 {
			maxWait = 0
		}
		clone := func() BucketState {
			return BucketState{Stamp: st.Stamp, Debts: append([]int64(nil), st.Debts...)}
		}
		ref := []BucketState{clone()}
		want, wantChanged := decide(now, take(b, n, maxWait), ref)

		fast := []BucketState{clone()}
		got, changed := Decide(now, take(b, n, maxWait), fast)
		if got != want || changed != wantChanged || fast[0].Stamp != ref[0].Stamp || fast[0].Debts[0] != ref[0].Debts[0] {
			t.Fatalf("trial %d: Decide %+v %v %+v, want %+v %v %+v", trial, got, changed, fast[0], want, wantChanged, ref[0])
		}
		one := clone()
		res := Result{Allowed: true, Bucket: 7, Degraded: true} // overwritten
		changed = DecideOne(now, b.Limits, n, maxWait, &one, &res)
		if res != want || changed != wantChanged || one.Stamp != ref[0].Stamp || one.Debts[0] != ref[0].Debts[0] {
			t.Fatalf("trial %d: DecideOne %+v %v %+v, want %+v %v %+v", trial, res, changed, one, want, wantChanged, ref[0])
		}
		if got.Limit != lim.plain() {
			t.Fatalf("trial %d: result limit %+v carries the cache", trial, got.Limit)
		}
	}
}

// TestDecideOneSeveralLimits checks DecideOne on a bucket with several
// limits against Decide.
func TestDecideOneSeveralLimits(t *testing.T) {
	t.Parallel()
	limits := []Limit{PerSecond(10, 3).compiled(), Every(time.Minute, 5)}
	now := int64(1_700_000_000) * sec
	ref, one := []BucketState{{}}, BucketState{}
	for i := range 12 {
		req := take(Bucket{Key: "k", Limits: limits}, int64(i%3), time.Duration(i%2)*time.Minute)
		want, wantChanged := Decide(now, req, ref)
		var got Result
		changed := DecideOne(now, limits, req.N, req.MaxWait, &one, &got)
		if got != want || changed != wantChanged || one.Stamp != ref[0].Stamp || !slices.Equal(one.Debts, ref[0].Debts) {
			t.Fatalf("step %d: DecideOne %+v %v %+v, want %+v %v %+v", i, got, changed, one, want, wantChanged, ref[0])
		}
		now += 40_000
	}
}
