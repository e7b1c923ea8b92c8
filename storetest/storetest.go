// Package storetest is the conformance suite every fleetrate.Store passes.
// A store's tests call Run with a constructor; each scenario uses keys of
// its own, so one store may serve them all.
//
// The scenarios run on the store's real clock. They stay exact anyway: every
// Result carries At, the store's time of decision, and the expectations
// are computed from it.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
)

// ApproximateDenials is implemented by stores that may answer a denial
// from a cache of earlier ones (package overlimit): its retry-after is
// then a lower bound of the store's, measured on the cache's own clock.
// MatchesModel accepts such a denial when the model denies the same take
// on the same limit, with a retry-after no longer than the model's.
type ApproximateDenials interface {
	ApproximateDenials()
}

// StateReader is implemented by stores that can show a bucket's raw state.
// Run uses it to compare the store with the pure algorithm step by step.
type StateReader interface {
	State(ctx context.Context, key string) (gcra.State, bool, error)
}

var runID atomic.Int64

// Run runs every scenario against the stores that newStore returns.
func Run(t *testing.T, newStore func(t *testing.T) fleetrate.Store) {
	scenarios := []struct {
		name string
		fn   func(t *testing.T, s fleetrate.Store, key func(string) string)
	}{
		{"BurstThenDeny", burstThenDeny},
		{"MultiLimit", multiLimit},
		{"MultiBucketAllOrNothing", multiBucket},
		{"PeekDoesNotConsume", peek},
		{"ReserveBooksAhead", reserve},
		{"PriorityKeepsReserve", priorityKeepsReserve},
		{"PriorityHorizonBoundsHigherWait", priorityHorizon},
		{"PriorityAcrossBuckets", priorityAcrossBuckets},
		{"BurstExceeded", burstExceeded},
		{"InvalidRequest", invalidRequest},
		{"Refund", refund},
		{"Drain", drain},
		{"Reset", reset},
		{"LimitsChanged", limitsChanged},
		{"LimitChangeKeepsFraction", limitChangeKeepsFraction},
		{"CancelGivesBackWhatNoLaterBookingRelieson", cancelBooking},
		{"CancelSeveralBuckets", cancelSeveralBuckets},
		{"ConcurrentExact", concurrentExact},
		{"CancelledContext", cancelledContext},
		{"HostileKeys", hostileKeys},
		{"ExtremeLimits", extremeLimits},
		{"MatchesModel", matchesModel},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			s := newStore(t)
			id := runID.Add(1)
			key := func(name string) string {
				return fmt.Sprintf("fleetrate:storetest:%d:%d:%s", time.Now().UnixNano(), id, name)
			}
			sc.fn(t, s, key)
		})
	}
}

func mustTake(t *testing.T, s fleetrate.Store, req fleetrate.Request) fleetrate.Result {
	t.Helper()
	res, err := s.Take(context.Background(), req)
	if err != nil {
		t.Fatalf("Take(%+v): %v", req, err)
	}
	return res
}

func one(key string, n int64, maxWait time.Duration, limits ...fleetrate.Limit) fleetrate.Request {
	return fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: key, Limits: limits}}, N: n, MaxWait: maxWait}
}

func burstThenDeny(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Minute, 5)
	k := key("b")
	var first fleetrate.Result
	for i := range 5 {
		res := mustTake(t, s, one(k, 1, 0, lim))
		if !res.Allowed || res.Remaining != int64(4-i) || res.RetryAfter != 0 || res.Wait != 0 {
			t.Fatalf("take %d: %+v, want allowed with %d remaining", i, res, 4-i)
		}
		if i == 0 {
			first = res
		}
	}
	res := mustTake(t, s, one(k, 1, 0, lim))
	el := res.At.Sub(first.At)
	if res.Allowed || res.Remaining != 0 {
		t.Fatalf("sixth take: %+v, want denied", res)
	}
	if want := time.Minute - el; res.RetryAfter != want {
		t.Fatalf("RetryAfter = %v, want %v (1m minus %v elapsed)", res.RetryAfter, want, el)
	}
	if want := 5*time.Minute - el; res.ResetAfter != want {
		t.Fatalf("ResetAfter = %v, want %v", res.ResetAfter, want)
	}
	if res.Limit != lim || res.Bucket != 0 {
		t.Fatalf("decided by %+v bucket %d, want %+v", res.Limit, res.Bucket, lim)
	}
}

func multiLimit(t *testing.T, s fleetrate.Store, key func(string) string) {
	sec := fleetrate.PerSecond(100, 10).Named("second")
	minute := fleetrate.Every(time.Minute, 3).Named("minute")
	k := key("m")
	for i := range 3 {
		res := mustTake(t, s, one(k, 1, 0, sec, minute))
		if !res.Allowed || res.Limit.Name != "minute" || res.Remaining != int64(2-i) {
			t.Fatalf("take %d: %+v", i, res)
		}
	}
	res := mustTake(t, s, one(k, 1, 0, sec, minute))
	if res.Allowed || res.Limit.Name != "minute" {
		t.Fatalf("fourth take: %+v, want denied by minute", res)
	}
}

func multiBucket(t *testing.T, s fleetrate.Store, key func(string) string) {
	roomy := fleetrate.Bucket{Key: key("{c}/roomy"), Limits: []fleetrate.Limit{fleetrate.Every(time.Minute, 10)}}
	tight := fleetrate.Bucket{Key: key("{c}/tight"), Limits: []fleetrate.Limit{fleetrate.Every(time.Minute, 1)}}
	both := fleetrate.Request{Buckets: []fleetrate.Bucket{roomy, tight}, N: 1}
	if res := mustTake(t, s, both); !res.Allowed || res.Bucket != 1 || res.Remaining != 0 {
		t.Fatalf("first: %+v", res)
	}
	if res := mustTake(t, s, both); res.Allowed || res.Bucket != 1 {
		t.Fatalf("second: %+v, want denied by bucket 1", res)
	}
	res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{roomy}})
	if res.Remaining != 9 {
		t.Fatalf("roomy has %d left, want 9: a denied take consumed from it", res.Remaining)
	}
}

func peek(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Minute, 2)
	k := key("p")
	for range 3 {
		if res := mustTake(t, s, one(k, 0, 0, lim)); !res.Allowed || res.Remaining != 2 || res.ResetAfter != 0 {
			t.Fatalf("peek on full bucket: %+v", res)
		}
	}
	mustTake(t, s, one(k, 2, 0, lim))
	if res := mustTake(t, s, one(k, 0, 0, lim)); !res.Allowed || res.Remaining != 0 {
		t.Fatalf("peek on empty bucket: %+v, want allowed (not in debt) with 0 left", res)
	}
	mustTake(t, s, one(k, 1, 2*time.Minute, lim))
	if res := mustTake(t, s, one(k, 0, 0, lim)); res.Allowed || res.RetryAfter <= 0 {
		t.Fatalf("peek on bucket in debt: %+v, want denied", res)
	}
}

func reserve(t *testing.T, s fleetrate.Store, key func(string) string) {
	// Intervals of 10 s keep the scenario exact however slow the machine:
	// the expectations are computed from the store's own decision times.
	const iv = 10 * time.Second
	lim := fleetrate.Every(iv, 1)
	k := key("r")
	r1 := mustTake(t, s, one(k, 1, 5*iv, lim))
	if !r1.Allowed || r1.Wait != 0 {
		t.Fatalf("first: %+v", r1)
	}
	r2 := mustTake(t, s, one(k, 1, 5*iv, lim))
	if want := iv - r2.At.Sub(r1.At); !r2.Allowed || r2.Wait != want {
		t.Fatalf("second: %+v, want booked with wait %v", r2, want)
	}
	r3 := mustTake(t, s, one(k, 1, iv+iv/2, lim))
	if want := 2*iv - r3.At.Sub(r1.At); r3.Allowed || r3.RetryAfter != want {
		t.Fatalf("third: %+v, want denied with retry %v", r3, want)
	}
	r4 := mustTake(t, s, one(k, 1, 5*iv, lim))
	if want := 2*iv - r4.At.Sub(r1.At); !r4.Allowed || r4.Wait != want {
		t.Fatalf("fourth: %+v, want booked with wait %v (FIFO after second)", r4, want)
	}
}

// lower returns req's buckets as takes of a lower class keeping reserve
// tokens.
func lower(req fleetrate.Request, reserve int64) fleetrate.Request {
	req.Buckets = slices.Clone(req.Buckets)
	for i := range req.Buckets {
		req.Buckets[i].Reserve = reserve
	}
	return req
}

// priorityKeepsReserve: a lower class takes only what is left beyond the
// reserve; the top class then finds the reserve; a reserve the take cannot
// leave is an error, never a denial.
func priorityKeepsReserve(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Minute, 5)
	k := key("pr")
	for i := range 3 {
		if res := mustTake(t, s, lower(one(k, 1, 0, lim), 2)); !res.Allowed || res.Remaining != int64(4-i) {
			t.Fatalf("low take %d: %+v, want allowed", i, res)
		}
	}
	first := mustTake(t, s, one(k, 0, 0, lim))
	res := mustTake(t, s, lower(one(k, 1, 0, lim), 2))
	if want := time.Minute - res.At.Sub(first.At); res.Allowed || res.Remaining != 2 || res.RetryAfter > time.Minute || res.RetryAfter <= 0 {
		t.Fatalf("low take beyond the reserve: %+v, want denied with 2 left, retry about %v", res, want)
	}
	if res := mustTake(t, s, lower(one(k, 0, 0, lim), 2)); !res.Allowed || res.Remaining != 2 {
		t.Fatalf("a peek of the low class: %+v, want allowed (the reserve is there) with 2 left", res)
	}
	for i := range 2 {
		if res := mustTake(t, s, one(k, 1, 0, lim)); !res.Allowed || res.Remaining != int64(1-i) {
			t.Fatalf("top-class take %d: %+v, want allowed from the reserve", i, res)
		}
	}
	_, err := s.Take(context.Background(), lower(one(k, 2, 0, lim), 4))
	if !errors.Is(err, fleetrate.ErrBurstExceeded) {
		t.Fatalf("n 2 with reserve 4 of burst 5: %v, want ErrBurstExceeded", err)
	}
	_, err = s.Take(context.Background(), lower(one(k, 0, 0, lim), 5))
	if !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("reserve of the whole burst: %v, want ErrInvalid", err)
	}
}

// priorityHorizon: a lower class with reserve R books at most its horizon
// D ahead, so a higher-class take of n <= R waits at most D - (R-n)*T
// behind it, ahead of lower-class takes that came first.
func priorityHorizon(t *testing.T, s fleetrate.Store, key func(string) string) {
	const iv = 10 * time.Second // exact however slow the machine (see reserve)
	lim := fleetrate.Every(iv, 4)
	k := key("ph")
	const reserveTokens, horizon = 2, 3 * iv / 2
	low := func(n int64) fleetrate.Request { return lower(one(k, n, horizon, lim), reserveTokens) }
	r1 := mustTake(t, s, low(2))
	if !r1.Allowed || r1.Wait != 0 {
		t.Fatalf("low 2: %+v, want allowed now", r1)
	}
	r2 := mustTake(t, s, low(1))
	if want := iv - r2.At.Sub(r1.At); !r2.Allowed || r2.Wait != want {
		t.Fatalf("low 1: %+v, want booked %v ahead", r2, want)
	}
	r3 := mustTake(t, s, low(1))
	if want := 2*iv - r3.At.Sub(r1.At); r3.Allowed || r3.RetryAfter != want {
		t.Fatalf("low beyond the horizon: %+v, want denied with retry %v", r3, want)
	}
	h1 := mustTake(t, s, one(k, 1, time.Hour, lim))
	if !h1.Allowed || h1.Wait != 0 {
		t.Fatalf("high 1: %+v, want allowed now from the reserve", h1)
	}
	// The reserve's second token: D - (R-2)*T = 15 s from r1, at most.
	h2 := mustTake(t, s, one(k, 1, time.Hour, lim))
	if want := iv - h2.At.Sub(r1.At); !h2.Allowed || h2.Wait != want || h2.Wait > horizon {
		t.Fatalf("high 2: %+v, want booked %v ahead, within the horizon %v", h2, want, horizon)
	}
}

// priorityAcrossBuckets: each bucket of a take keeps its own reserve, all
// or nothing: a take that would break the reserve of one bucket books
// nothing in the other.
func priorityAcrossBuckets(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Minute, 4)
	shared := fleetrate.Bucket{Key: key("{pa}/credential"), Limits: []fleetrate.Limit{lim}, Reserve: 2}
	own := fleetrate.Bucket{Key: key("{pa}/endpoint"), Limits: []fleetrate.Limit{lim}}
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{own, shared}, N: 1}
	for i := range 2 {
		if res := mustTake(t, s, req); !res.Allowed {
			t.Fatalf("take %d: %+v", i, res)
		}
	}
	if res := mustTake(t, s, req); res.Allowed || res.Bucket != 1 {
		t.Fatalf("third take: %+v, want denied by the shared bucket's reserve", res)
	}
	own.Reserve, shared.Reserve = 0, 0
	if res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{own}}); res.Remaining != 2 {
		t.Fatalf("the endpoint bucket has %d left, want 2: a denied take consumed from it", res.Remaining)
	}
}

func burstExceeded(t *testing.T, s fleetrate.Store, key func(string) string) {
	_, err := s.Take(context.Background(), one(key("x"), 3, time.Hour, fleetrate.PerSecond(1, 2)))
	if !errors.Is(err, fleetrate.ErrBurstExceeded) {
		t.Fatalf("n > burst: err = %v, want ErrBurstExceeded", err)
	}
}

func invalidRequest(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	bad := []fleetrate.Request{
		one("", 1, 0, fleetrate.PerSecond(1, 1)),
		one(key("i"), 1, 0, fleetrate.PerSecond(0, 1)),
		one(key("i"), 1, 0),
		one(key("i"), -1, 0, fleetrate.PerSecond(1, 1)),
		one(key("i"), 1, -time.Second, fleetrate.PerSecond(1, 1)),
		{},
	}
	for i, req := range bad {
		if _, err := s.Take(ctx, req); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Errorf("request %d: err = %v, want ErrInvalid", i, err)
		}
	}
	if err := s.Refund(ctx, nil, 1, time.Now()); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("refund of no buckets: %v", err)
	}
	if err := s.Drain(ctx, []fleetrate.Bucket{{Key: key("i")}}, time.Second); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("drain without limits: %v", err)
	}
	ok := []fleetrate.Bucket{{Key: key("i"), Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}
	if err := s.Drain(ctx, ok, -time.Second); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("negative drain: %v", err)
	}
	if err := s.Drain(ctx, ok, fleetrate.MaxWaitCap+1); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("drain beyond MaxWaitCap: %v", err)
	}
	if err := s.Refund(ctx, ok, -1, time.Now()); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("negative refund: %v", err)
	}
	if err := s.Refund(ctx, ok, 1, time.Time{}); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "refund at") {
		t.Errorf("refund without the grant's time: %v", err)
	}
}

func refund(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Minute, 5)
	k := key("f")
	got := mustTake(t, s, one(k, 3, 0, lim))
	b := []fleetrate.Bucket{{Key: k, Limits: []fleetrate.Limit{lim}}}
	if err := s.Refund(context.Background(), b, 2, got.At); err != nil {
		t.Fatal(err)
	}
	// A minute a token: within a test's run, time has refilled none of
	// the grant's tokens, so they all go back.
	if res := mustTake(t, s, one(k, 0, 0, lim)); res.Remaining != 4 {
		t.Fatalf("after refund of 2: %d left, want 4", res.Remaining)
	}
	if err := s.Refund(context.Background(), b, 5, got.At); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(k, 0, 0, lim)); res.Remaining != 5 || res.ResetAfter != 0 {
		t.Fatalf("refund overfilled or underfilled: %+v", res)
	}

	// A grant made long ago, whose tokens time has refilled since: they
	// are not given back twice (the bucket would otherwise grant them
	// again on top of what refilled).
	k2 := key("f2")
	b2 := []fleetrate.Bucket{{Key: k2, Limits: []fleetrate.Limit{lim}}}
	mustTake(t, s, one(k2, 5, 0, lim))
	old := mustTake(t, s, one(k2, 0, 0, lim)).At.Add(-3 * time.Minute)
	if err := s.Refund(context.Background(), b2, 5, old); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(k2, 0, 0, lim)); res.Remaining != 2 {
		t.Fatalf("refund of 5 tokens granted 3 minutes ago (3 refilled since): %d left, want 2", res.Remaining)
	}

	// Nothing goes back while a slot is booked ahead: a later take would
	// be granted a slot before the booked one.
	k3 := key("f3")
	b3 := []fleetrate.Bucket{{Key: k3, Limits: []fleetrate.Limit{lim}}}
	first := mustTake(t, s, one(k3, 5, 0, lim))
	if res := mustTake(t, s, one(k3, 1, 2*time.Minute, lim)); !res.Allowed || res.Wait <= 0 {
		t.Fatalf("booking ahead: %+v", res)
	}
	if err := s.Refund(context.Background(), b3, 5, first.At); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(k3, 1, 0, lim)); res.Allowed {
		t.Fatalf("a refund with a slot booked ahead let a take through before it: %+v", res)
	}
}

func drain(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.PerSecond(1, 5)
	k := key("d")
	before := mustTake(t, s, one(k, 0, 0, lim))
	if err := s.Drain(context.Background(), []fleetrate.Bucket{{Key: k, Limits: []fleetrate.Limit{lim}}}, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	res := mustTake(t, s, one(k, 1, 0, lim))
	el := res.At.Sub(before.At)
	// The drain happened between the two takes: the bucket is empty until
	// 10 s after it, and the first token arrives one interval later.
	if res.Allowed || res.RetryAfter > 11*time.Second || res.RetryAfter < 11*time.Second-el {
		t.Fatalf("after drain: %+v, want denied for about 11s (el %v)", res, el)
	}
	// A booking during the drain lands after it, one token at a time.
	r := mustTake(t, s, one(k, 1, time.Minute, lim))
	if !r.Allowed || r.Wait < 11*time.Second-el-r.At.Sub(res.At) || r.Wait > 11*time.Second {
		t.Fatalf("reservation during drain: %+v", r)
	}
}

func reset(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Minute, 3)
	k := key("z")
	mustTake(t, s, one(k, 3, 0, lim))
	if err := s.Reset(context.Background(), k); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(k, 0, 0, lim)); res.Remaining != 3 {
		t.Fatalf("after reset: %+v, want full", res)
	}
}

func limitsChanged(t *testing.T, s fleetrate.Store, key func(string) string) {
	a := fleetrate.Every(time.Minute, 3)
	b := fleetrate.Every(time.Hour, 10)
	k := key("c")
	mustTake(t, s, one(k, 3, 0, a))
	// The limit kept keeps its debt, at another position too; the limit
	// added starts full (it was not in use).
	for _, limits := range [][]fleetrate.Limit{{a, b}, {b, a}} {
		res := mustTake(t, s, one(k, 1, 0, limits...))
		if res.Allowed || res.Limit.Rate != a.Rate || res.RetryAfter > time.Minute || res.RetryAfter < 50*time.Second {
			t.Fatalf("after adding a limit %v: %+v, want denied by %v for about a minute", limits, res, a)
		}
	}
	// A configuration with the added limit taking in turn with one
	// without never finds the bucket full again: the two together take
	// what the limit they share allows (3 tokens of a a minute), not a
	// fresh bucket at every turn.
	k2 := key("c2")
	granted := 0
	for i := range 40 {
		limits := []fleetrate.Limit{a}
		if i%2 == 1 {
			limits = []fleetrate.Limit{b, a}
		}
		if mustTake(t, s, one(k2, 1, 0, limits...)).Allowed {
			granted++
		}
	}
	if granted > 3 {
		t.Fatalf("two configurations in turn were granted %d takes, want at most a's burst, 3", granted)
	}
}

// limitChangeKeepsFraction changes a bucket's limits (a reload, an
// override) and checks that the bucket keeps the fraction it had in use
// instead of reading its debt under the new limit: the two cases that
// locked keys out for hours before.
func limitChangeKeepsFraction(t *testing.T, s fleetrate.Store, key func(string) string) {
	day := fleetrate.PerPeriod(100, 24*time.Hour)
	minute := fleetrate.PerPeriod(10, time.Minute)
	k := key("day-to-minute")
	for range 5 {
		if res := mustTake(t, s, one(k, 10, 0, day)); !res.Allowed {
			t.Fatalf("taking 50 of 100/day: %+v", res)
		}
	}
	// Half of the day's bucket is in use: half of the minute's is.
	res := mustTake(t, s, one(k, 1, 0, minute))
	if !res.Allowed || res.Remaining != 4 {
		t.Fatalf("50 of 100/day, then 10/minute: %+v, want allowed with 4 left (5 of 10 in use before the take)", res)
	}
	// And back: the minute's fraction becomes the day's.
	if res := mustTake(t, s, one(k, 0, 0, day)); !res.Allowed || res.Remaining < 39 || res.Remaining > 40 {
		t.Fatalf("then 100/day again: %+v, want about 40 left (6 of 10 in use)", res)
	}

	k = key("day-to-hour")
	if res := mustTake(t, s, one(k, 1, 0, fleetrate.PerPeriod(10, 24*time.Hour))); !res.Allowed {
		t.Fatalf("first hit at 10/day: %+v", res)
	}
	hour := fleetrate.PerPeriod(42, time.Hour)
	res = mustTake(t, s, one(k, 1, 0, hour))
	if !res.Allowed || res.Remaining != 36 {
		t.Fatalf("1 of 10/day, then 42/hour: %+v, want allowed with 36 left (4.2 of 42 in use before the take)", res)
	}
	// Emptied under the new limit, the bucket refills within its own fill
	// time: the next token is one interval away, not hours.
	mustTake(t, s, one(k, 36, 0, hour))
	res = mustTake(t, s, one(k, 1, 0, hour))
	if res.Allowed || res.RetryAfter > time.Duration(hour.Interval()) {
		t.Fatalf("emptied at 42/hour: %+v, want a retry within one interval (%v)", res, time.Duration(hour.Interval()))
	}
}

// cancelBooking checks that a cancelled booking gives its tokens back only
// when no later booking relies on them, as x/time/rate's Cancel does:
// otherwise a later reservation's slot would be granted twice.
func cancelBooking(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.Every(10*time.Second, 2) // slow, so the store's clock barely moves the slots
	b := []fleetrate.Bucket{{Key: key("cancel"), Limits: []fleetrate.Limit{lim}}}
	reserve := func(n int64) (fleetrate.Result, fleetrate.Booking) {
		t.Helper()
		var bk fleetrate.Booking
		res := mustTake(t, s, fleetrate.Request{Buckets: b, N: n, MaxWait: time.Minute, Booking: &bk})
		if !res.Allowed || len(bk.Debts) != 1 {
			t.Fatalf("reserve %d: %+v, booking %+v", n, res, bk)
		}
		return res, bk
	}
	slot := func(r fleetrate.Result) time.Time { return r.At.Add(r.Wait) }
	iv := time.Duration(lim.Interval())

	_, first := reserve(2) // the whole burst, now
	second, secondBk := reserve(1)
	// first has a booking after it: cancelling it must give nothing back.
	if err := s.Cancel(ctx, b, 2, first); err != nil {
		t.Fatal(err)
	}
	third, thirdBk := reserve(1)
	if got, want := slot(third), slot(second).Add(iv); !got.Equal(want) {
		t.Fatalf("after cancelling a booking that a later one relies on, the next slot is %v, want %v (one interval after the later one)", got, want)
	}
	// third is the latest: cancelling it frees its slot for the next one.
	if err := s.Cancel(ctx, b, 1, thirdBk); err != nil {
		t.Fatal(err)
	}
	fourth, _ := reserve(1)
	if !slot(fourth).Equal(slot(third)) {
		t.Fatalf("after cancelling the latest booking the next slot is %v, want its slot %v", slot(fourth), slot(third))
	}
	// Cancelling second now gives nothing back (fourth relies on it).
	if err := s.Cancel(ctx, b, 1, secondBk); err != nil {
		t.Fatal(err)
	}
	fifth, fifthBk := reserve(1)
	if got, want := slot(fifth), slot(fourth).Add(iv); !got.Equal(want) {
		t.Fatalf("after cancelling a relied-on booking the next slot is %v, want %v", got, want)
	}
	// A booking whose slot has begun gives nothing back, as x/time/rate's
	// Cancel restores nothing after its time to act: its caller may have
	// acted on it.
	nb := []fleetrate.Bucket{{Key: key("cancel-begun"), Limits: []fleetrate.Limit{lim}}}
	var nowBk fleetrate.Booking
	if res := mustTake(t, s, fleetrate.Request{Buckets: nb, N: 1, MaxWait: time.Minute, Booking: &nowBk}); !res.Allowed || res.Wait != 0 {
		t.Fatalf("reserve now: %+v", res)
	}
	time.Sleep(2 * time.Millisecond) // past the slot on the store's clock
	if err := s.Cancel(ctx, nb, 1, nowBk); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(nb[0].Key, 0, 0, lim)); res.Remaining != 1 {
		t.Fatalf("a cancel after the slot began gave the token back: %d left, want 1", res.Remaining)
	}
	// A booking that does not match the buckets is an error, not a guess.
	if err := s.Cancel(ctx, b, 1, fleetrate.Booking{Stamp: 1}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("cancel with an empty booking: %v, want ErrInvalid", err)
	}
	if err := s.Cancel(ctx, b, -1, secondBk); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Fatalf("cancel of -1 tokens: %v, want ErrInvalid", err)
	}
	// More tokens than a burst: no take booked them (and n × interval
	// overflowed into a lockout of centuries in memstore).
	if err := s.Cancel(ctx, b, fleetrate.MaxBurst, fifthBk); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "cancel n") {
		t.Fatalf("cancel of MaxBurst tokens: %v, want ErrInvalid naming n", err)
	}
}

// cancelSeveralBuckets checks that each bucket of a cancelled booking is
// handled on its own: the one booked again since keeps the tokens, the
// other gets them back.
func cancelSeveralBuckets(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.Every(10*time.Second, 1)
	ep := fleetrate.Bucket{Key: key("{cs}/endpoint"), Limits: []fleetrate.Limit{lim}}
	cred := fleetrate.Bucket{Key: key("{cs}"), Limits: []fleetrate.Limit{lim}}
	var bk fleetrate.Booking
	both := []fleetrate.Bucket{ep, cred}
	// Both buckets empty now, then a booking of both, 10 s ahead: a
	// booking whose slot has not begun.
	mustTake(t, s, fleetrate.Request{Buckets: both, N: 1})
	booked := mustTake(t, s, fleetrate.Request{Buckets: both, N: 1, MaxWait: time.Minute, Booking: &bk})
	if !booked.Allowed || booked.Wait <= 0 || len(bk.Debts) != 2 {
		t.Fatalf("booking of both: %+v, booking %+v", booked, bk)
	}
	// A later booking on the credential alone relies on the first one.
	later := mustTake(t, s, one(cred.Key, 1, time.Minute, lim))
	if !later.Allowed {
		t.Fatalf("later booking: %+v", later)
	}
	if err := s.Cancel(ctx, both, 1, bk); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, one(ep.Key, 1, time.Minute, lim)); !res.Allowed || !res.At.Add(res.Wait).Equal(booked.At.Add(booked.Wait)) {
		t.Fatalf("the endpoint had no later booking and should have its slot back (%v): %+v", booked.At.Add(booked.Wait), res)
	}
	next := mustTake(t, s, one(cred.Key, 1, time.Minute, lim))
	if got, want := next.At.Add(next.Wait), later.At.Add(later.Wait).Add(time.Duration(lim.Interval())); !got.Equal(want) {
		t.Fatalf("the credential gave back a token a later booking relies on: next slot %v, want %v", got, want)
	}
}

func concurrentExact(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Hour, 100)
	k := key("cc")
	var allowed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			for range 10 {
				res, err := s.Take(context.Background(), one(k, 1, 0, lim))
				if err != nil {
					errs <- err
					return
				}
				if res.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := allowed.Load(); got != 100 {
		t.Fatalf("%d of 500 concurrent takes allowed, want exactly the burst of 100", got)
	}
}

func cancelledContext(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := s.Take(ctx, one(key("x"), 1, 0, fleetrate.PerSecond(1, 1)))
	if err == nil || res.Allowed {
		t.Fatalf("cancelled context: %+v, %v; want an error", res, err)
	}
}

// extremeLimits uses the longest fill time and drain the bounds allow, where
// an intermediate sum would pass 2^53 ns and lose precision in Lua's
// doubles: the answer must still be exact to the nanosecond.
func extremeLimits(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(30*24*time.Hour, 2) // fill time: the 60-day maximum
	k := key("x")
	b := []fleetrate.Bucket{{Key: k, Limits: []fleetrate.Limit{lim}}}
	if err := s.Drain(context.Background(), b, fleetrate.MaxWaitCap-1); err != nil {
		t.Fatal(err)
	}
	res := mustTake(t, s, one(k, 1, 0, lim))
	if res.Allowed {
		t.Fatalf("take during a 30-day drain allowed: %+v", res)
	}
	if got, want := res.ResetAfter-res.RetryAfter, time.Duration(lim.Interval()); got != want {
		t.Fatalf("reset-after minus retry-after = %v, want exactly one interval %v (%+v)", got, want, res)
	}
}

// hostileKeys checks that binary keys, braces, separators and newlines are
// ordinary, distinct buckets.
func hostileKeys(t *testing.T, s fleetrate.Store, key func(string) string) {
	lim := fleetrate.Every(time.Hour, 1)
	names := []string{"\x00\xff\x01", "\xfe", "\xff", "{}", "}{", "a\nb", "a\r\nb", "a b", "a:b", "a%3Ab", strings.Repeat("\xfe", 300)}
	keys := make([]string, len(names))
	for i, n := range names {
		keys[i] = key(n)
	}
	for i, n := range names {
		if res := mustTake(t, s, one(keys[i], 1, 0, lim)); !res.Allowed {
			t.Fatalf("first take of %q: %+v (shares a bucket with another key?)", n, res)
		}
	}
	for i, n := range names {
		if res := mustTake(t, s, one(keys[i], 1, 0, lim)); res.Allowed {
			t.Fatalf("second take of %q allowed: the key did not keep its bucket", n)
		}
	}
}

// matchesModel drives random operations and checks every decision, and
// every stored state the store can show, against fleetrate.Decide run on
// the store's own clock.
func matchesModel(t *testing.T, s fleetrate.Store, key func(string) string) {
	m := &modelRun{t: t, s: s, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7)), model: map[string]*gcra.State{}}
	m.reader, _ = s.(StateReader)
	m.buckets = []fleetrate.Bucket{
		{Key: key("{m}/a"), Limits: []fleetrate.Limit{fleetrate.PerSecond(2000, 5)}},
		{Key: key("{m}/b"), Limits: []fleetrate.Limit{fleetrate.PerSecond(700, 3), fleetrate.PerSecond(3, 7)}},
		{Key: key("{m}/c"), Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 4), fleetrate.PerSecond(333, 9)}},
	}
	a, b, c := m.buckets[0].Key, m.buckets[1].Key, m.buckets[2].Key
	m.alts = map[string][][]fleetrate.Limit{
		a: {{fleetrate.PerSecond(2000, 3)}, {fleetrate.PerSecond(2000, 5), fleetrate.PerSecond(50, 9)}},
		b: {{fleetrate.PerSecond(3, 7), fleetrate.PerSecond(700, 3)}, {fleetrate.PerSecond(700, 5), fleetrate.PerSecond(3, 7)}, {fleetrate.PerSecond(3, 7)}},
		c: {{fleetrate.PerSecond(1e6, 4)}, {fleetrate.PerSecond(333, 9), fleetrate.PerSecond(1e5, 4)}},
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
	if res != wantRes && !cached {
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
		func(now int64, b fleetrate.Bucket, st *gcra.State) { gcra.Drain(now, b.Limits, st, d) })
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

// minBurst returns the smallest burst of limits.
func minBurst(limits []fleetrate.Limit) int64 {
	m := limits[0].Burst
	for _, l := range limits[1:] {
		m = min(m, l.Burst)
	}
	return m
}
