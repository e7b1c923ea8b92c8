package redisstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/redistest"
)

// TestBatchMatchesSequentialModel sends batches of random takes, many on
// the same keys and some naming a key with a different number of limits,
// through one call of the batch script, and checks every decision and the
// stored state against fleetrate.Decide applied to the takes one after the
// other at the batch's instant.
func TestBatchMatchesSequentialModel(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(), Options{Timeout: 2 * time.Second, Batch: true})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 11))
	limitSets := [][]fleetrate.Limit{
		{fleetrate.PerSecond(1000, 5)},
		{fleetrate.PerSecond(50, 3), fleetrate.Every(time.Minute, 7)},
		{fleetrate.Every(time.Hour, 2)},
	}
	for round := range 40 {
		model := map[string]*fleetrate.BucketState{}
		keys := make([]string, 4)
		for i := range keys {
			keys[i] = fmt.Sprintf("fleetrate:batchtest:%d:%d", round, i)
			model[keys[i]] = &fleetrate.BucketState{}
		}
		var batch []*batchCall
		for range 1 + rng.IntN(maxBatch/4) {
			req := fleetrate.Request{N: rng.Int64N(3), MaxWait: time.Duration(rng.Int64N(int64(10 * time.Millisecond)))}
			if rng.IntN(3) == 0 {
				req.MaxWait = 0
			}
			for _, i := range rng.Perm(len(keys))[:1+rng.IntN(2)] {
				ls := limitSets[rng.IntN(len(limitSets))]
				if rng.IntN(8) != 0 {
					ls = limitSets[i%2] // mostly the key's usual limits
				}
				req.Buckets = append(req.Buckets, fleetrate.Bucket{Key: keys[i], Limits: ls})
			}
			if err := req.Validate(); err != nil {
				t.Fatal(err)
			}
			c := newBatchCall()
			c.req = req
			if rng.IntN(2) == 0 {
				for _, b := range req.Buckets {
					c.keys = append(c.keys, b.StoreKey())
				}
			}
			if len(req.Buckets) == 1 && rng.IntN(2) == 0 {
				c.largs = appendLimits(nil, req.Buckets) // as a bound taker
			}
			batch = append(batch, c)
		}
		s.batch.send(batch)

		at := int64(-1)
		for i, c := range batch {
			if c.err != nil {
				t.Fatalf("round %d take %d: %v", round, i, c.err)
			}
			got := c.rs[0]
			if at == -1 {
				at = got.At.UnixMicro()
			} else if got.At.UnixMicro() != at {
				t.Fatalf("round %d take %d decided at %v, the batch at %d µs", round, i, got.At, at)
			}
			states := make([]fleetrate.BucketState, len(c.req.Buckets))
			for j, b := range c.req.Buckets {
				states[j] = fleetrate.BucketState{Stamp: model[b.Key].Stamp, Debts: slices.Clone(model[b.Key].Debts)}
			}
			// Like the stores, the model keeps a state only when the take
			// changed it (a take under other limits that books nothing
			// leaves the key as it was).
			want, changed := fleetrate.Decide(at, c.req, states)
			for j, b := range c.req.Buckets {
				if changed {
					*model[b.Key] = states[j]
				}
			}
			if got != want {
				t.Fatalf("round %d take %d (%+v):\nbatch decided %+v\nmodel decided %+v", round, i, c.req, got, want)
			}
		}
		// What the batch left in Redis is what the model holds (a full
		// bucket is absent).
		for _, k := range keys {
			st, ok, err := s.State(t.Context(), k)
			if err != nil {
				t.Fatal(err)
			}
			want := model[k]
			full := !slices.ContainsFunc(want.Debts, func(d int64) bool { return d > 0 })
			if !ok {
				if !full {
					t.Fatalf("round %d key %s absent, model holds %+v", round, k, *want)
				}
				continue
			}
			if !slices.Equal(st.Debts, want.Debts) {
				t.Fatalf("round %d key %s holds %+v, model %+v", round, k, st, *want)
			}
		}
	}
}

// TestDecodeReplyRejectsBadReplies: a script reply that ends early, carries
// extra values or announces impossible decisions fails the whole batch.
func TestDecodeReplyRejectsBadReplies(t *testing.T) {
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 5)}
	c := newBatchCall()
	c.req = fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "k", Limits: lim}}, N: 1}
	decode := func(reply []int64) ([][]fleetrate.Result, error) {
		return decodeReply(reply, 1, func(int) (fleetrate.Request, int) { return c.req, 1 })
	}
	if _, err := decode([]int64{1_800_000_000_000_000, 1, 0}); err != nil {
		t.Fatalf("a good reply: %v", err)
	}
	for _, reply := range [][]int64{
		{},
		{1_800_000_000_000_000},
		{1_800_000_000_000_000, 1},
		{1_800_000_000_000_000, 1, 0, 7}, // extra value
		{1_800_000_000_000_000, 2, 0},    // more decisions than takes
		{1_800_000_000_000_000, 0, 0},    // no decision
		{1_800_000_000_000_000, 1, -5},   // negative debt
	} {
		if _, err := decode(reply); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
			t.Errorf("reply %v: %v, want ErrStoreUnavailable", reply, err)
		}
	}
}
