package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

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
