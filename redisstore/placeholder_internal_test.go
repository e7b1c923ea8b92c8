package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// TestPlaceholderIsAFullBucket checks what gathering a script's keys on a
// migration's target relies on: a key holding the placeholder is read as
// an absent one, a full bucket, by every script and by State, whatever the
// bucket's limits. Each take from a placeholder must decide exactly as the
// same take from an absent key, alone or beside another bucket, one at a
// time or batched.
func TestPlaceholderIsAFullBucket(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	limitSets := map[string][]fleetrate.Limit{
		// Slow enough that no token comes back during the test.
		"one limit":  {fleetrate.PerPeriod(5, time.Hour)},
		"two limits": {fleetrate.PerPeriod(5, time.Hour), fleetrate.PerPeriod(100, 24*time.Hour)},
	}
	for _, opts := range []Options{{Unbatched: true}, {Batch: true}} {
		s, err := New(srv.Client(), Options{Timeout: 2 * time.Second, Unbatched: opts.Unbatched, Batch: opts.Batch})
		if err != nil {
			t.Fatal(err)
		}
		for name, limits := range limitSets {
			for _, buckets := range []int{1, 2} {
				t.Run(fmt.Sprintf("batch=%v/%s/%d buckets", opts.Batch, name, buckets), func(t *testing.T) {
					// Lanes at once, so that batched takes share calls of
					// the batch script.
					var wg sync.WaitGroup
					for lane := range 8 {
						absent := takeFrom(t, s, fmt.Sprintf("absent%d", lane), limits, buckets)
						held := takeFrom(t, s, fmt.Sprintf("held%d", lane), limits, buckets)
						if err := srv.Client().Set(ctx, held[0].StoreKey(), placeholder, time.Minute).Err(); err != nil {
							t.Fatal(err)
						}
						if st, ok, err := s.State(ctx, held[0].StoreKey()); err != nil || !ok || st.Debts[0] != 0 {
							t.Fatalf("State of a placeholder: %+v, %v, %v; want debt 0", st, ok, err)
						}
						wg.Go(func() { comparePlaceholder(t, s, absent, held) })
					}
					wg.Wait()
				})
			}
		}
	}
}

// comparePlaceholder takes one token at a time, past the burst, from held
// (whose first bucket holds the placeholder) and from absent, and fails t
// when the two decide differently.
func comparePlaceholder(t *testing.T, s *Store, absent, held []fleetrate.Bucket) {
	ctx := context.Background()
	for i := range 7 {
		want, err := s.Take(ctx, fleetrate.Request{Buckets: absent, N: 1})
		if err != nil {
			t.Error(err)
			return
		}
		got, err := s.Take(ctx, fleetrate.Request{Buckets: held, N: 1})
		if err != nil {
			t.Error(err)
			return
		}
		if got.Allowed != want.Allowed || got.Remaining != want.Remaining {
			t.Errorf("take %d from a placeholder: allowed %v, %d left; from an absent key: %v, %d", i+1, got.Allowed, got.Remaining, want.Allowed, want.Remaining)
			return
		}
	}
}

// takeFrom returns n buckets of one {hash tag} named after tag, each with
// limits, their keys cleared when t ends.
func takeFrom(t *testing.T, s *Store, tag string, limits []fleetrate.Limit, n int) []fleetrate.Bucket {
	t.Helper()
	var bs []fleetrate.Bucket
	for i := range n {
		b := fleetrate.Bucket{Key: fmt.Sprintf("{%s-%s}/%d", t.Name(), tag, i), Limits: limits}
		bs = append(bs, b)
		t.Cleanup(func() { _ = s.Reset(context.Background(), b.StoreKey()) })
	}
	return bs
}
