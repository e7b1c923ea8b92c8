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
		{"CancelAfterTheSlotBeganGivesNothing", cancelBegun},
		{"CancelInvalid", cancelInvalid},
		{"CancelSeveralBuckets", cancelSeveralBuckets},
		{"ConcurrentExact", concurrentExact},
		{"CancelledContext", cancelledContext},
		{"HostileKeys", hostileKeys},
		{"ExtremeLimits", extremeLimits},
		{"MatchesModel", matchesModel},
		{"DrainEach", drainEach},
		{"CostsByBucket", costsByBucket},
		{"CostsCancel", costsCancel},
		{"Settle", settle},
		{"SettleGivesBackByLaterLeads", settleExact},
		{"InFlightBound", inFlightBound},
		{"PermitAllOrNothing", permitAllOrNothing},
		{"PermitQueue", permitQueue},
		{"PermitLease", permitLease},
		{"PermitStalledQueue", permitStalledQueue},
		{"PermitPriority", permitPriority},
		{"QuotaCounts", quotaCounts},
		{"QuotaChange", quotaChange},
		{"QuotaBoundary", quotaBoundary},
		{"QuotaInvalid", quotaInvalid},
		{"QuotaRefusedByTwo", quotaRefusedByTwo},
		{"PermitRace", permitRace},
		{"PermitInvalid", permitInvalid},
		{"TakeMany", takeMany},
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
	coarseExtremes(t, s, key)
}

// coarseExtremes is extremeLimits for limits of fill times beyond
// fleetrate.CoarseFillTime, up to MaxFillTime, whose debts pass 2^53 ns:
// a drain of an odd number of ns (rounded up to whole µs), a take booked
// behind a shorter limit's wait, and answers exact to the nanosecond.
func coarseExtremes(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	year := fleetrate.Every(24*time.Hour, 365)   // envoyproxy/ratelimit's 365/year
	long := fleetrate.Every(365*24*time.Hour, 2) // fill time 730 days
	k := key("coarse")
	b := []fleetrate.Bucket{{Key: k, Limits: []fleetrate.Limit{long}}}
	if err := s.Drain(ctx, b, fleetrate.MaxWaitCap-1); err != nil {
		t.Fatal(err)
	}
	res := mustTake(t, s, one(k, 1, 0, long))
	if res.Allowed {
		t.Fatalf("take during a 30-day drain of a 730-day limit allowed: %+v", res)
	}
	// The drain's odd nanosecond is rounded up to a whole µs: the debt is
	// 30 days plus the fill time, less the µs since the drain.
	if got, want := res.ResetAfter, fleetrate.MaxWaitCap+2*365*24*time.Hour; got > want || got < want-time.Second || got%time.Microsecond != 0 {
		t.Fatalf("reset-after %v, want whole µs just below %v (%+v)", got, want, res)
	}
	if got, want := res.ResetAfter-res.RetryAfter, time.Duration(long.Interval()); got != want {
		t.Fatalf("reset-after minus retry-after = %v, want exactly one interval %v (%+v)", got, want, res)
	}

	// 364 of 365 tokens of a year, then the last beside a fast limit,
	// then one more: a debt of 365 days, past 2^53 ns, and answers exact
	// to the nanosecond (whole µs, less the µs since the takes).
	k2 := key("year")
	lims := []fleetrate.Limit{fleetrate.PerSecond(333, 1), year}
	res = mustTake(t, s, one(k2, 364, 0, year))
	if !res.Allowed || res.Remaining != 1 {
		t.Fatalf("364 of 365/year: %+v", res)
	}
	take := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: k2, Limits: lims}}, N: 1, MaxWait: time.Second}
	if res = mustTake(t, s, take); !res.Allowed || res.Remaining != 0 {
		t.Fatalf("the 365th token: %+v", res)
	}
	res = mustTake(t, s, take)
	if res.Allowed || res.RetryAfter > 24*time.Hour || res.RetryAfter < 24*time.Hour-time.Second || res.LimitIndex != 1 {
		t.Fatalf("a 366th token of 365/year: %+v, want a retry after a day, for the year", res)
	}
	if got, want := res.ResetAfter-res.RetryAfter, 364*24*time.Hour; got != want || res.ResetAfter%time.Microsecond != 0 {
		t.Fatalf("reset-after %v minus retry-after = %v, want exactly %v, in whole µs (%+v)", res.ResetAfter, got, want, res)
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

// minBurst returns the smallest burst of limits.
func minBurst(limits []fleetrate.Limit) int64 {
	m := limits[0].Burst
	for _, l := range limits[1:] {
		m = min(m, l.Burst)
	}
	return m
}
