package storetest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// takeMany checks fleetrate.TakeMany on the store (its own TakeMany when
// it is a MultiTaker): each request is decided as Take decides it and
// independently of the others, a bad one is refused alone with an error
// naming its field, and concurrent calls together grant exactly a
// bucket's burst.
func takeMany(t *testing.T, s fleetrate.Store, key func(string) string) {
	ctx := context.Background()
	lim := fleetrate.Every(time.Hour, 3)
	// a and b may be on different Cluster slots; c and d, taken
	// together, share one.
	a, b, c, d := key("{a}"), key("{b}"), key("{c}/c"), key("{c}/d")
	reqs := []fleetrate.Request{
		one(a, 2, 0, lim),
		one(b, 3, 0, lim),
		one(a, 2, 0, lim), // a has 1 left after the first: denied
		one(c, 0, 0, lim), // a peek
		{Buckets: []fleetrate.Bucket{{Key: b, Limits: []fleetrate.Limit{lim}}}, N: -1}, // invalid
		{Buckets: []fleetrate.Bucket{{Key: d, Limits: []fleetrate.Limit{lim}}, {Key: c, Limits: []fleetrate.Limit{lim}}}, N: 1},
	}
	res, errs := make([]fleetrate.Result, len(reqs)), make([]error, len(reqs))
	if err := fleetrate.TakeMany(ctx, s, reqs, res, errs); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(errs[4], fleetrate.ErrInvalid) {
		t.Errorf("request 4 (n = -1): error %v, want one wrapping ErrInvalid", errs[4])
	}
	for i, err := range errs {
		if i != 4 && err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	// Of the two takes of 2 from a, exactly one is granted (the store
	// orders them as it likes).
	if res[0].Allowed == res[2].Allowed {
		t.Errorf("two takes of 2 from a bucket of 3: allowed %v and %v, want exactly one", res[0].Allowed, res[2].Allowed)
	}
	if !res[1].Allowed || res[1].Remaining != 0 {
		t.Errorf("take of 3 from a full bucket of 3: %+v, want allowed with 0 left", res[1])
	}
	if !res[3].Allowed || res[3].N != 0 {
		t.Errorf("peek: %+v, want allowed, taking nothing", res[3])
	}
	if !res[5].Allowed {
		t.Errorf("take from two full buckets: %+v, want allowed", res[5])
	}
	// What they left is what Take sees: a has 1 token, b none, c 2.
	for _, w := range []struct {
		key  string
		left int64
	}{{a, 1}, {b, 0}, {c, 2}} {
		if got := mustTake(t, s, one(w.key, 0, 0, lim)); got.Remaining != w.left {
			t.Errorf("bucket %s after TakeMany: %d left, want %d", w.key, got.Remaining, w.left)
		}
	}
	if err := fleetrate.TakeMany(ctx, s, reqs, res[:1], errs); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("TakeMany with 1 result for %d requests: %v, want an error wrapping ErrInvalid", len(reqs), err)
	}
	for i, err := range errs {
		if !errors.Is(err, fleetrate.ErrInvalid) {
			t.Errorf("TakeMany with 1 result: errs[%d] = %v, want its error wrapping ErrInvalid", i, err)
		}
	}

	// 8 callers at once, each with 8 takes of 1 from one bucket of 20:
	// exactly 20 granted.
	hot := key("hot")
	burst := fleetrate.Every(time.Hour, 20)
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			reqs := make([]fleetrate.Request, 8)
			for i := range reqs {
				reqs[i] = one(hot, 1, 0, burst)
			}
			res, errs := make([]fleetrate.Result, 8), make([]error, 8)
			if err := fleetrate.TakeMany(ctx, s, reqs, res, errs); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for i := range res {
				if errs[i] != nil {
					t.Error(errs[i])
				} else if res[i].Allowed {
					granted++
				}
			}
		})
	}
	wg.Wait()
	if granted != 20 {
		t.Errorf("64 concurrent takes of 1 through TakeMany from a bucket of 20: %d granted, want exactly 20", granted)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := fleetrate.TakeMany(cancelled, s, reqs[:2], res[:2], errs[:2]); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if errs[i] == nil || res[i].Allowed {
			t.Errorf("cancelled context, request %d: %+v, %v; want an error", i, res[i], errs[i])
		}
	}
}
