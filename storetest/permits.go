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
)

// bounded is a bucket of in-flight bound n with a rate that never binds.
func bounded(key string, n int64) fleetrate.Bucket {
	return fleetrate.Bucket{Key: key, Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 1e6)}, InFlight: n}
}

// acquire takes one token and a permit for id.
func acquire(bs []fleetrate.Bucket, id string, maxWait time.Duration) fleetrate.Request {
	return fleetrate.Request{Buckets: bs, N: 1, MaxWait: maxWait, Permit: fleetrate.Permit{ID: id, TTL: 10 * time.Second}}
}

// inFlightBound checks the bound, release (twice is harmless) and renew.
func inFlightBound(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	bs := []fleetrate.Bucket{bounded(key("inflight"), 2)}
	for i, id := range []string{"a", "b"} {
		res := mustTake(t, s, acquire(bs, id, 0))
		if !res.Allowed || res.InFlight != (fleetrate.InFlight{Bound: 2, Held: int64(i + 1)}) {
			t.Fatalf("permit %d of 2: %+v, want allowed with %d held", i+1, res, i+1)
		}
	}
	res := mustTake(t, s, acquire(bs, "c", 0))
	if res.Allowed || res.InFlight.Held != 2 || res.InFlight.Queued || res.RetryAfter <= 0 || res.RetryAfter > 10*time.Second {
		t.Fatalf("a third permit of 2: %+v, want denied, not queued, retry within the lease", res)
	}
	if res := mustTake(t, s, acquire(bs, "a", 0)); !res.Allowed || res.InFlight.Held != 2 {
		t.Fatalf("a retried acquire by a holder: %+v, want allowed without a second permit", res)
	}
	if held, err := s.Release(ctx, bs, "a"); err != nil || held != 1 {
		t.Fatalf("Release(a) = %d, %v, want 1", held, err)
	}
	if held, err := s.Release(ctx, bs, "a"); err != nil || held != 0 {
		t.Fatalf("a second Release(a) = %d, %v, want 0 and no error", held, err)
	}
	if res := mustTake(t, s, acquire(bs, "c", 0)); !res.Allowed || res.InFlight.Held != 2 {
		t.Fatalf("a permit after a release: %+v, want allowed", res)
	}
	p := fleetrate.Permit{ID: "b", TTL: 20 * time.Second}
	if held, err := s.Renew(ctx, bs, p); err != nil || held != 1 {
		t.Fatalf("Renew(b) = %d, %v, want 1", held, err)
	}
	p.ID = "gone"
	if held, err := s.Renew(ctx, bs, p); err != nil || held != 0 {
		t.Fatalf("Renew of a permit never held = %d, %v, want 0", held, err)
	}
	// A peek reports the bound without taking a permit.
	if res := mustTake(t, s, fleetrate.Request{Buckets: bs}); res.InFlight != (fleetrate.InFlight{Bound: 2, Held: 2}) {
		t.Fatalf("peek: %+v, want 2 of 2 held", res.InFlight)
	}
	if err := s.Reset(ctx, bs[0].StoreKey()); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, fleetrate.Request{Buckets: bs}); res.InFlight.Held != 0 {
		t.Fatalf("after Reset: %+v, want no permit held", res.InFlight)
	}
}

// permitAllOrNothing checks that a take denied by a rate takes no permit,
// and one denied for a permit takes no tokens.
func permitAllOrNothing(t *testing.T, s fleetrate.Store, key func(string) string) {
	rate := fleetrate.Bucket{Key: key("{p}:rate"), Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 1)}}
	bs := []fleetrate.Bucket{bounded(key("{p}:bound"), 1), rate}
	if res := mustTake(t, s, acquire(bs, "a", 0)); !res.Allowed {
		t.Fatalf("first take: %+v", res)
	}
	// The rate is empty: b is denied by it and must hold no permit.
	if res := mustTake(t, s, acquire(bs, "b", 0)); res.Allowed || res.Bucket != 1 {
		t.Fatalf("a take the rate denies: %+v, want denied by bucket 1", res)
	}
	if held, err := s.Release(context.Background(), bs, "a"); err != nil || held != 1 {
		t.Fatalf("Release(a) = %d, %v", held, err)
	}
	only := []fleetrate.Bucket{bs[0]}
	if res := mustTake(t, s, acquire(only, "c", 0)); !res.Allowed || res.InFlight.Held != 1 {
		t.Fatalf("after the release: %+v, want the one permit free (the denied take held none)", res)
	}
	// Now the permit is taken: a take denied for it takes no token.
	other := fleetrate.Bucket{Key: key("{p}:rate2"), Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, 1)}}
	if res := mustTake(t, s, acquire([]fleetrate.Bucket{bs[0], other}, "d", 0)); res.Allowed {
		t.Fatalf("a take with no permit free: %+v, want denied", res)
	}
	if res := mustTake(t, s, one(other.Key, 1, 0, other.Limits...)); !res.Allowed {
		t.Fatalf("the rate bucket after a take denied for its permit: %+v, want its token still there", res)
	}
}

// permitQueue checks that takes that may wait queue first come, first
// served, that a take that may not wait never jumps the queue, and that a
// release wakes the first waiter when the store can tell.
func permitQueue(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	bs := []fleetrate.Bucket{bounded(key("queue"), 1)}
	mustTake(t, s, acquire(bs, "a", 0))
	for i, id := range []string{"b", "c"} {
		res := mustTake(t, s, acquire(bs, id, time.Second))
		if res.Allowed || !res.InFlight.Queued || res.InFlight.Ahead != i {
			t.Fatalf("waiter %s: %+v, want queued with %d ahead", id, res, i)
		}
	}
	var woke <-chan struct{}
	if n, ok := s.(fleetrate.PermitNotifier); ok {
		ch, stop := n.NotifyPermit(bs[0].StoreKey(), "b")
		defer stop()
		woke = ch
	}
	if _, err := s.Release(ctx, bs, "a"); err != nil {
		t.Fatal(err)
	}
	if woke != nil {
		select {
		case <-woke:
		case <-time.After(10 * time.Second):
			t.Fatal("the first waiter was not notified within 10 s of the release")
		}
	}
	if res := mustTake(t, s, acquire(bs, "late", 0)); res.Allowed {
		t.Fatalf("a take that may not wait, with two waiting: %+v, want denied (it must not jump the queue)", res)
	}
	if res := mustTake(t, s, acquire(bs, "c", time.Second)); res.Allowed || res.InFlight.Ahead != 1 {
		t.Fatalf("the second waiter after a release: %+v, want still queued behind the first", res)
	}
	if res := mustTake(t, s, acquire(bs, "b", time.Second)); !res.Allowed || res.InFlight.Held != 1 {
		t.Fatalf("the first waiter after a release: %+v, want granted", res)
	}
	// A waiter that gives up leaves the queue.
	if _, err := s.Release(ctx, bs, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, bs, "b"); err != nil {
		t.Fatal(err)
	}
	if res := mustTake(t, s, acquire(bs, "late", 0)); !res.Allowed {
		t.Fatalf("a take with the queue empty and the permit free: %+v, want allowed", res)
	}
}

// permitStalledQueue checks the wait a store reports to a take held back
// by a waiter that stopped at the head of the queue (a paused process),
// with the permit free: until that waiter's place lapses, not a moment,
// which would have every waiter behind it take again at once.
func permitStalledQueue(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	bs := []fleetrate.Bucket{bounded(key("stalled"), 1)}
	mustTake(t, s, acquire(bs, "holder", 0))
	if res := mustTake(t, s, acquire(bs, "stalled", time.Second)); !res.InFlight.Queued {
		t.Fatalf("the waiter: %+v, want queued", res)
	}
	if _, err := s.Release(ctx, bs, "holder"); err != nil {
		t.Fatal(err)
	}
	// The stalled waiter's place lapses 10 s after its take (acquire's
	// TTL); each take below sees at most the calls' time less.
	for _, tc := range []struct {
		id      string
		maxWait time.Duration
	}{{"behind", time.Second}, {"late", 0}} {
		res := mustTake(t, s, acquire(bs, tc.id, tc.maxWait))
		if res.Allowed || res.RetryAfter < 5*time.Second || res.RetryAfter > 10*time.Second {
			t.Fatalf("%s, with the permit free and a stalled waiter ahead: allowed %v, retry after %v; want denied, retry after up to 10 s, when its place lapses",
				tc.id, res.Allowed, res.RetryAfter)
		}
	}
}

// permitLease checks that a permit nobody renews lapses at its lease on
// the store's clock, never before, and that a renewed one does not.
func permitLease(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	bs := []fleetrate.Bucket{bounded(key("lease"), 1), bounded(key("renewed"), 1)}
	ttl := fleetrate.MinPermitTTL
	req := func(b fleetrate.Bucket, id string) fleetrate.Request {
		return fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, Permit: fleetrate.Permit{ID: id, TTL: ttl}}
	}
	first := mustTake(t, s, req(bs[0], "dead"))
	mustTake(t, s, req(bs[1], "alive"))
	if res := mustTake(t, s, req(bs[0], "next")); res.Allowed && res.At.Sub(first.At) < ttl {
		t.Fatalf("a permit was granted %v after another's, within its lease of %v", res.At.Sub(first.At), ttl)
	}
	// Renew the live holder's lease twice during the dead one's.
	for range 2 {
		time.Sleep(ttl * 3 / 5)
		if held, err := s.Renew(ctx, []fleetrate.Bucket{bs[1]}, fleetrate.Permit{ID: "alive", TTL: ttl}); err != nil || held != 1 {
			t.Fatalf("Renew(alive) = %d, %v, want 1", held, err)
		}
	}
	if res := mustTake(t, s, req(bs[0], "next")); !res.Allowed {
		t.Fatalf("%v after a permit nobody renewed, with a lease of %v: %+v, want it lapsed", res.At.Sub(first.At), ttl, res)
	}
	if res := mustTake(t, s, req(bs[1], "next")); res.Allowed {
		t.Fatalf("a permit renewed within its lease was taken by another: %+v", res)
	}
}

// permitRace checks that goroutines racing for the last permits never hold
// more than the bound.
func permitRace(t *testing.T, s fleetrate.Store, key func(string) string) {
	bs := []fleetrate.Bucket{bounded(key("race"), 3)}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			res, err := s.Take(context.Background(), acquire(bs, fmt.Sprintf("w%d", i), 0))
			if err != nil {
				t.Error(err)
			}
			if res.Allowed {
				granted.Add(1)
			}
		})
	}
	wg.Wait()
	if g := granted.Load(); g != 3 {
		t.Fatalf("40 racing takes of a bound of 3 were granted %d permits", g)
	}
}

// permitInvalid checks that bad permits and bounds name the field.
func permitInvalid(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	b := bounded(key("bad"), 2)
	plain := fleetrate.Bucket{Key: key("plain"), Limits: b.Limits}
	for _, bad := range []struct {
		req  fleetrate.Request
		want string
	}{
		{fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1}, "permit.id"},
		{fleetrate.Request{Buckets: []fleetrate.Bucket{plain}, N: 1, Permit: fleetrate.Permit{ID: "x", TTL: time.Minute}}, "no bucket of the take bounds"},
		{acquireTTL(b, "x", time.Millisecond), "permit.ttl"},
		{acquireTTL(b, "has space", time.Minute), "permit.id"},
		{acquireTTL(b, strings.Repeat("x", fleetrate.MaxPermitIDLen+1), time.Minute), "permit.id"},
		{acquireTTL(fleetrate.Bucket{Key: b.Key, Limits: b.Limits, InFlight: -1}, "x", time.Minute), "in_flight"},
		{acquireTTL(fleetrate.Bucket{Key: b.Key, Limits: b.Limits, InFlight: fleetrate.MaxInFlight + 1}, "x", time.Minute), "in_flight"},
	} {
		if _, err := s.Take(ctx, bad.req); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Take(%+v): %v, want ErrInvalid naming %q", bad.req.Permit, err, bad.want)
		}
	}
	if _, err := s.Release(ctx, []fleetrate.Bucket{plain}, "x"); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("Release from buckets without a bound: %v, want ErrInvalid", err)
	}
	if _, err := s.Renew(ctx, []fleetrate.Bucket{b}, fleetrate.Permit{ID: "x", TTL: time.Millisecond}); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "permit.ttl") {
		t.Errorf("Renew with a TTL too short to renew: %v, want ErrInvalid naming permit.ttl", err)
	}
}

func acquireTTL(b fleetrate.Bucket, id string, ttl time.Duration) fleetrate.Request {
	return fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, Permit: fleetrate.Permit{ID: id, TTL: ttl}}
}

// permitPriority checks priority classes on permits: a take of a lower
// class leaves its reserve free, and a lower-class waiter at the head of
// the queue never holds back a take of the top class.
func permitPriority(t *testing.T, s fleetrate.Store, key func(string) string) {
	b := bounded(key("classes"), 3)
	low := b
	low.PermitReserve = 1
	take := func(bk fleetrate.Bucket, id string, maxWait time.Duration) fleetrate.Result {
		t.Helper()
		return mustTake(t, s, acquire([]fleetrate.Bucket{bk}, id, maxWait))
	}
	if res := take(low, "low1", 0); !res.Allowed {
		t.Fatalf("a low take with 0 of 3 held and a reserve of 1: %+v, want granted", res)
	}
	if res := take(low, "low2", 0); !res.Allowed {
		t.Fatalf("a low take with 1 of 3 held: %+v, want granted", res)
	}
	if res := take(low, "low3", time.Second); res.Allowed || !res.InFlight.Queued {
		t.Fatalf("a low take with 2 of 3 held, the last kept for the top class: %+v, want queued", res)
	}
	// The top class passes the low waiter.
	if res := take(b, "top", time.Second); !res.Allowed || res.InFlight.Held != 3 {
		t.Fatalf("a top take behind a low waiter, 1 of 3 free: %+v, want granted", res)
	}
	// Released, the permit goes to the low waiter when no top one waits.
	if _, err := s.Release(context.Background(), []fleetrate.Bucket{b}, "low1"); err != nil {
		t.Fatal(err)
	}
	if res := take(b, "top2", time.Second); !res.Allowed {
		t.Fatalf("a top take with 1 free and a low waiter ahead: %+v, want granted (the low one keeps 1 free)", res)
	}
	invalid := bounded(key("bad"), 2)
	invalid.PermitReserve = 2
	if _, err := s.Take(context.Background(), acquire([]fleetrate.Bucket{invalid}, "x", 0)); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "permit_reserve") {
		t.Errorf("a permit reserve of the whole bound: %v, want ErrInvalid naming permit_reserve", err)
	}
}
