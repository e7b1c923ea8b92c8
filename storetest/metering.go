package storetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// meteredBuckets are a requests bucket and a tokens bucket of one
// credential, slow enough (hours to refill) that the store's clock barely
// moves them during a scenario.
func meteredBuckets(key func(string) string) []fleetrate.Bucket {
	return []fleetrate.Bucket{
		{Key: key("{cred}:requests"), Limits: []fleetrate.Limit{fleetrate.PerPeriod(10, time.Hour)}},
		{Key: key("{cred}:tokens"), Limits: []fleetrate.Limit{fleetrate.PerPeriod(1000, time.Hour)}},
	}
}

// costs builds a take of costs by bucket.
func costs(bs []fleetrate.Bucket, maxWait time.Duration, c ...int64) fleetrate.Request {
	return fleetrate.Request{Buckets: bs, Costs: c, MaxWait: maxWait}
}

// costsByBucket checks that one take charges each bucket its own cost,
// all or nothing: "1 request and 600 tokens".
func costsByBucket(t *testing.T, s fleetrate.Store, key func(string) string) {
	bs := meteredBuckets(key)
	res := mustTake(t, s, costs(bs, 0, 1, 600))
	if !res.Allowed || res.Remaining != 9 || res.Bucket != 0 || res.N != 1 {
		t.Fatalf("take of 1 request and 600 tokens: %+v, want allowed, 9 left in the requests bucket (the tightest)", res)
	}
	res = mustTake(t, s, costs(bs, 0, 1, 600))
	if res.Allowed || res.Bucket != 1 || res.N != 600 {
		t.Fatalf("a second 600 tokens with 400 left: %+v, want denied by the tokens bucket (bucket 1) with N 600", res)
	}
	// The denial took nothing from the requests bucket: 9 requests left.
	if res := mustTake(t, s, costs(bs, 0, 9, 400)); !res.Allowed || res.Remaining != 0 {
		t.Fatalf("9 requests and 400 tokens after a denial: %+v, want allowed with nothing left (the denial took nothing)", res)
	}
	if res := mustTake(t, s, costs(bs, 0, 0, 1)); res.Allowed {
		t.Fatalf("1 token from an empty tokens bucket at no request: %+v, want denied", res)
	}

	ctx := context.Background()
	for _, bad := range []struct {
		req  fleetrate.Request
		want string
		is   error
	}{
		{fleetrate.Request{Buckets: bs, N: 1, Costs: []int64{1, 1}}, "n must be 0 when costs are set", fleetrate.ErrInvalid},
		{costs(bs, 0, 1), "1 costs for 2 buckets", fleetrate.ErrInvalid},
		{costs(bs, 0, 1, -5), "costs[1]", fleetrate.ErrInvalid},
		{costs(bs, 0, 1, 1001), "burst 1000", fleetrate.ErrBurstExceeded},
	} {
		_, err := s.Take(ctx, bad.req)
		if !errors.Is(err, bad.is) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Take(costs %v, n %d): %v, want %v naming %q", bad.req.Costs, bad.req.N, err, bad.is, bad.want)
		}
	}
}

// costsCancel checks that a booking of costs by bucket is given back cost
// by cost.
func costsCancel(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	bs := []fleetrate.Bucket{
		{Key: key("{c}:requests"), Limits: []fleetrate.Limit{fleetrate.Every(2*time.Second, 1)}},
		{Key: key("{c}:tokens"), Limits: []fleetrate.Limit{fleetrate.PerPeriod(1000, time.Hour)}},
	}
	mustTake(t, s, costs(bs, 0, 1, 0)) // empty the requests bucket
	var bk fleetrate.Booking
	req := costs(bs, 5*time.Second, 1, 300)
	req.Booking = &bk
	res := mustTake(t, s, req)
	if !res.Allowed || res.Wait <= 0 || len(bk.Costs) != 2 || bk.Costs[1] != 300 {
		t.Fatalf("booking 1 request and 300 tokens ahead: %+v, booking %+v", res, bk)
	}
	// Every limit is booked at the take's slot, so the tokens bucket is
	// whole again only from then: ask with a max wait beyond it.
	if res := mustTake(t, s, costs(bs, 5*time.Second, 0, 1000)); res.Allowed {
		t.Fatalf("the whole tokens bucket while 300 are booked: %+v, want denied", res)
	}
	if err := s.Cancel(ctx, bs, 0, bk); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, costs(bs, 5*time.Second, 0, 1000)); !res.Allowed {
		t.Fatalf("the whole tokens bucket after cancelling the booking of 300: %+v, want allowed", res)
	}
	if err := s.Cancel(ctx, bs, 1, bk); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("cancel of a booking with costs and n 1: %v, want ErrInvalid", err)
	}
}

// settle checks that a grant settled to less gets the difference back, to
// more owes it at once (never refused, even beyond empty), and that bad
// settles name the value.
func settle(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.PerPeriod(1000, time.Hour) // 3.6 s a token
	bs := []fleetrate.Bucket{{Key: key("settle"), Limits: []fleetrate.Limit{lim}}}
	peek := func() fleetrate.Result { t.Helper(); return mustTake(t, s, costs(bs, 0, 0)) }
	grant := mustTake(t, s, costs(bs, 0, 500))
	if !grant.Allowed || grant.Remaining != 500 {
		t.Fatalf("take of 500: %+v", grant)
	}
	at := grant.At.Add(grant.Wait)
	do := func(cost, actual int64) {
		t.Helper()
		if err := s.Settle(ctx, bs, fleetrate.Settlement{Costs: []int64{cost}, Actual: []int64{actual}, At: at}); err != nil {
			t.Fatalf("settle %d to %d: %v", cost, actual, err)
		}
	}
	do(500, 200) // 300 back, less what time refilled since (well under a token)
	if r := peek().Remaining; r < 799 || r > 800 {
		t.Fatalf("after settling 500 to 200: %d left, want 799 or 800", r)
	}
	do(200, 700) // owes 500 more
	if r := peek().Remaining; r < 299 || r > 300 {
		t.Fatalf("after settling 200 to 700: %d left, want 299 or 300", r)
	}
	do(0, 1000) // beyond empty: never refused
	res := peek()
	if res.Allowed || res.Remaining != 0 {
		t.Fatalf("after a charge beyond empty: %+v, want in debt", res)
	}
	if res := mustTake(t, s, costs(bs, 0, 1)); res.Allowed || res.RetryAfter < lim.FillTime()/2 {
		t.Fatalf("a take after owing 700 beyond empty: %+v, want denied for about 700 tokens' time", res)
	}
	do(300, 300) // no change
	settleBookedAhead(t, s, key)

	for _, bad := range []struct {
		st   fleetrate.Settlement
		want string
	}{
		{fleetrate.Settlement{Costs: []int64{1}, Actual: []int64{1, 2}, At: at}, "for 1 buckets"},
		{fleetrate.Settlement{Costs: []int64{1}, Actual: []int64{1001}, At: at}, "actual[0]"},
		{fleetrate.Settlement{Costs: []int64{-1}, Actual: []int64{1}, At: at}, "costs[0]"},
		{fleetrate.Settlement{Costs: []int64{1}, Actual: []int64{1}}, "settle at"},
	} {
		if err := s.Settle(ctx, bs, bad.st); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Settle(%+v): %v, want ErrInvalid naming %q", bad.st, err, bad.want)
		}
	}
}

// settleBookedAhead checks that a settle to less of a grant the store
// knows no leads for (the first of a bucket: see gcra.Lead) gives nothing
// back while a later take is booked ahead on the bucket: that take's slot
// was computed from the tokens the settle would give back, and without
// its lead a take after the settle could be granted a slot before it,
// closer than the limit allows (the bound of docs/ARCHITECTURE.md,
// "Settling"). settleExact checks what goes back by the leads.
func settleBookedAhead(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.PerPeriod(1000, time.Hour) // 3.6 s a token
	bs := []fleetrate.Bucket{{Key: key("settle-ahead"), Limits: []fleetrate.Limit{lim}}}
	grant := mustTake(t, s, costs(bs, 0, 1000)) // empties it
	if !grant.Allowed {
		t.Fatalf("take of 1000: %+v", grant)
	}
	if res := mustTake(t, s, costs(bs, time.Minute, 10)); !res.Allowed || res.Wait <= 0 {
		t.Fatalf("booking 10 tokens ahead of an empty bucket: %+v, want allowed with a wait", res)
	}
	before := mustTake(t, s, costs(bs, 0, 1))
	st := fleetrate.Settlement{Costs: []int64{1000}, Actual: []int64{100}, At: grant.At.Add(grant.Wait)}
	if err := s.Settle(ctx, bs, st); err != nil {
		t.Fatalf("settle 1000 to 100: %v", err)
	}
	after := mustTake(t, s, costs(bs, 0, 1))
	// 900 tokens back would cut the wait by 54 minutes; a second of
	// clock between the two takes is the most the wait may shrink.
	if before.Allowed || after.Allowed || after.RetryAfter < before.RetryAfter-time.Second {
		t.Fatalf("a settle to less with a slot booked ahead: a take of 1 waited %v before it and %v after, want no shorter", before.RetryAfter, after.RetryAfter)
	}
}

// settleExact checks the give-back of a settle to less by the leads of
// the takes after the grant (gcra.Lead): with slots booked ahead, a grant
// settled to less gets back the difference up to the least lead of the
// takes decided after it (its limit's debt before the take less its
// wait), nothing after a drain or a reset, and a store's first epoch of
// grants, of which it knows nothing before, gets nothing back.
// It is long because the steps build on one bucket's history: each
// settle's give-back depends on every take and settle before it.
func settleExact(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.PerPeriod(1000, time.Hour) // 3.6 s a token, fill time 1 h
	iv := lim.FillTime() / 1000
	bs := []fleetrate.Bucket{{Key: key("settle-exact"), Limits: []fleetrate.Limit{lim}}}
	take := func(n int64) fleetrate.Result {
		t.Helper()
		res := mustTake(t, s, costs(bs, 20*time.Hour, n))
		if !res.Allowed {
			t.Fatalf("take of %d: %+v", n, res)
		}
		return res
	}
	// wait is how long a take of 1 would wait now: the debt less the
	// burst less one token.
	wait := func() time.Duration {
		t.Helper()
		return mustTake(t, s, costs(bs, 0, 1)).RetryAfter
	}
	do := func(g fleetrate.Result, cost, actual int64) {
		t.Helper()
		st := fleetrate.Settlement{Costs: []int64{cost}, Actual: []int64{actual}, At: g.At.Add(g.Wait)}
		if err := s.Settle(ctx, bs, st); err != nil {
			t.Fatalf("settle %d to %d: %v", cost, actual, err)
		}
	}
	// expect checks that a settle gave back want tokens: the wait of a
	// take of 1 shrank by that many intervals, within the second of clock
	// the steps may take.
	expect := func(before time.Duration, want int64, what string) {
		t.Helper()
		got := before - wait()
		if d := got - time.Duration(want)*iv; d < -time.Second || d > time.Second {
			t.Fatalf("%s: the wait shrank by %v, want %v (%d tokens back)", what, got, time.Duration(want)*iv, want)
		}
	}
	// Takes of 500, each booked half a fill time after the one before
	// (lead 500 tokens): the first epoch, which knows nothing of what came
	// before it, ends two fill times of slots on.
	first := take(500)
	for range 6 {
		take(500)
	}
	before := wait()
	do(first, 500, 0)
	expect(before, 0, "the first grant of a bucket, settled 500 to 0 behind a slot booked ahead")
	g := take(500) // lead 500
	take(800)      // lead 200
	before = wait()
	do(g, 500, 400)
	expect(before, 100, "a grant settled 500 to 400 before takes of leads 500 and 200")
	// The give-back lowered the leads after g by 100.
	g = take(500) // lead 500
	take(900)     // lead 100, in the next epoch
	before = wait()
	do(g, 500, 0)
	expect(before, 100, "a grant settled 500 to 0 before a take of lead 100")
	h := take(500)
	if err := s.Drain(ctx, bs, time.Minute); err != nil {
		t.Fatal(err)
	}
	before = wait()
	do(h, 500, 0)
	expect(before, 0, "a grant settled to less after a drain")
	g = take(300)
	if err := s.Reset(ctx, bs[0].Key); err != nil {
		t.Fatal(err)
	}
	do(g, 300, 0)
	if r := mustTake(t, s, costs(bs, 0, 0)).Remaining; r != lim.Burst {
		t.Fatalf("a grant settled to less after a reset: %d left, want the burst %d", r, lim.Burst)
	}
	settleTwice(t, s, key)
}

// settleTwice checks that a Reservation's settle applies once over the
// store: a second settle to less is refused and gives nothing back.
func settleTwice(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	const name = "settle-twice"
	cfg := fleetrate.Config{Prefix: key(""), Buckets: []fleetrate.BucketConfig{{Name: name, Limits: []fleetrate.Limit{fleetrate.PerPeriod(1000, time.Hour)}}}}
	l, err := fleetrate.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.AllowCosts(ctx, fleetrate.Cost{Bucket: name, N: 600})
	if err != nil || !r.Result.Allowed {
		t.Fatalf("AllowCosts of 600: %+v, %v", r, err)
	}
	if err := r.Settle(ctx, fleetrate.Cost{Bucket: name, N: 500}); err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(ctx, fleetrate.Cost{Bucket: name, N: 0}); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "settled already") {
		t.Fatalf("a second settle: %v, want ErrInvalid saying it was settled already", err)
	}
	if peek, err := l.Peek(ctx, name); err != nil || peek.Remaining > 500 {
		t.Fatalf("after a settle of 600 to 500 and a refused second one: %+v, %v, want at most 500 left", peek, err)
	}
}
