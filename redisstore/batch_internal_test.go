package redisstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// TestBatchMatchesSequentialModel sends batches of random takes, many on
// the same keys and some naming a key with a different number of limits,
// through one call of the batch script, and checks every decision and the
// stored state against gcra.Decide applied to the takes one after the
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
	// A bound taker's encoded limits, one slice per limit set, shared by
	// its takes as a Limiter's are.
	bound := map[*fleetrate.Limit][]any{}
	boundArgs := func(ls []fleetrate.Limit) []any {
		if bound[&ls[0]] == nil {
			bound[&ls[0]] = appendTakeLimits(nil, []fleetrate.Bucket{{Limits: ls}})
		}
		return bound[&ls[0]]
	}
	for round := range 40 {
		model := map[string]*gcra.State{}
		keys := make([]string, 4)
		for i := range keys {
			keys[i] = fmt.Sprintf("fleetrate:batchtest:%d:%d", round, i)
			model[keys[i]] = &gcra.State{}
		}
		var batch []*batchCall
		for range 1 + rng.IntN(maxBatch/4) {
			req := fleetrate.Request{N: rng.Int64N(3), MaxWait: time.Duration(rng.Int64N(int64(10 * time.Millisecond)))}
			switch rng.IntN(3) {
			case 0:
				req.MaxWait = 0
			case 1:
				req.MaxWait = time.Millisecond // shapes repeat
			}
			for _, i := range rng.Perm(len(keys))[:1+rng.IntN(2)] {
				ls := limitSets[rng.IntN(len(limitSets))]
				if rng.IntN(8) != 0 {
					ls = limitSets[i%2] // mostly the key's usual limits
				}
				bk := fleetrate.Bucket{Key: keys[i], Limits: ls}
				if rng.IntN(4) == 0 {
					bk.Reserve = rng.Int64N(2) // a lower priority class (bursts are at least 2)
				}
				req.Buckets = append(req.Buckets, bk)
			}
			for _, bk := range req.Buckets {
				for _, l := range bk.Limits {
					req.N = min(req.N, l.Burst-bk.Reserve)
				}
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
			if len(req.Buckets) == 1 && req.Buckets[0].Reserve == 0 && rng.IntN(2) == 0 {
				c.largs = boundArgs(req.Buckets[0].Limits) // as a bound taker
			}
			batch = append(batch, c)
		}
		sent := time.Now()
		s.send(batch)

		at := int64(-1)
		for i, c := range batch {
			if c.err != nil {
				t.Fatalf("round %d take %d: %v", round, i, c.err)
			}
			got := c.res
			if at == -1 {
				at = got.At.UnixMicro()
			} else if got.At.UnixMicro() != at {
				t.Fatalf("round %d take %d decided at %v, the batch at %d µs", round, i, got.At, at)
			}
			states := make([]gcra.State, len(c.req.Buckets))
			for j, b := range c.req.Buckets {
				states[j] = model[b.Key].Clone()
			}
			// Like the stores, the model keeps a state only when the take
			// changed it (a take under other limits that books nothing
			// leaves the key as it was).
			want, changed := gcra.Decide(at, c.req, states)
			for j, b := range c.req.Buckets {
				if changed {
					*model[b.Key] = states[j]
				}
			}
			if !reflect.DeepEqual(got, want) {
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
				// A key lives until its bucket is full plus a second of
				// slack, so at 1000/s it may expire a second after the
				// batch, which a loaded machine can take to get here.
				if !full && time.Since(sent) < time.Second {
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
	decode := func(reply []int64) ([]fleetrate.Result, error) {
		var rs []fleetrate.Result
		err := decodeReply(reply, 1, func(int) (fleetrate.Request, int, *[]fleetrate.Result, func(int) *fleetrate.Booking) {
			return c.req, 1, &rs, func(int) *fleetrate.Booking { return nil }
		})
		return rs, err
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

// TestEncodeBatchSharesShapes encodes runs of takes and reads the
// arguments back as take_batch.lua does: every take gets its own keys,
// count, n, wait and limits, and takes of one shape share its arguments,
// found among the last maxShapeScan shapes.
func TestEncodeBatchSharesShapes(t *testing.T) {
	a := []fleetrate.Limit{fleetrate.PerSecond(10, 5)}
	b := []fleetrate.Limit{fleetrate.PerSecond(50, 3), fleetrate.Every(time.Minute, 7)}
	aArgs := appendTakeLimits(nil, []fleetrate.Bucket{{Limits: a}})
	call := func(n int64, wait time.Duration, largs []any, buckets ...fleetrate.Bucket) *batchCall {
		c := newBatchCall()
		c.req = fleetrate.Request{Buckets: buckets, N: n, MaxWait: wait}
		c.largs = largs
		return c
	}
	k := func(key string, ls []fleetrate.Limit) fleetrate.Bucket { return fleetrate.Bucket{Key: key, Limits: ls} }
	kr := func(key string, ls []fleetrate.Limit, r int64) fleetrate.Bucket {
		return fleetrate.Bucket{Key: key, Limits: ls, Reserve: r}
	}
	runs := [][]*batchCall{
		{call(1, 0, aArgs, k("x", a))},
		{call(1, 0, aArgs, k("y", a))},                               // bound: the shape of the first
		{call(1, 0, nil, k("z", a))},                                 // unbound, same limits: too
		{call(1, 0, aArgs, k("x", a)), call(1, 0, aArgs, k("x", a))}, // count 2: a new shape
		{call(2, 0, aArgs, k("x", a))},                               // n 2
		{call(1, time.Second, nil, k("x", a))},                       // a wait
		{call(1, 0, nil, k("x", b))},                                 // other limits
		{call(1, 0, nil, k("x", a), k("y", b))},                      // two keys
		{call(1, 0, nil, k("w", a), k("v", b))},                      // the shape before
		{call(1, 0, nil, kr("x", a, 2))},                             // a reserve
		{call(1, 0, nil, kr("y", a, 2))},                             // the shape before
	}
	for i := range 12 { // more shapes than a take is compared with
		runs = append(runs, []*batchCall{call(int64(3+i), 0, nil, k("u", a))})
	}
	runs = append(runs, []*batchCall{call(1, 0, aArgs, k("last", a))}) // the first shape, out of reach: a new one
	keys, args := encodeBatch(runs)

	num := func(i int) int64 {
		switch v := args[i].(type) {
		case int:
			return int64(v)
		case int64:
			return v
		}
		t.Fatalf("argument %d is %T", i, args[i])
		return 0
	}
	type shape struct {
		nb, n, wait, count int64
		limits             []int64
	}
	var shapes []shape
	pos := 1
	for range num(0) {
		sh := shape{nb: num(pos), n: num(pos + 1), wait: num(pos + 2), count: num(pos + 3)}
		pos += 4
		for range sh.nb {
			m := num(pos)
			for i := pos; i <= pos+2*int(m)+1; i++ { // the reserve after the limits
				sh.limits = append(sh.limits, num(i))
			}
			pos += 2 + 2*int(m)
		}
		shapes = append(shapes, sh)
	}
	if got, want := len(args)-pos, len(runs); got != want {
		t.Fatalf("%d take arguments for %d takes", got, want)
	}
	if want := 6 + 1 + 12 + 1; len(shapes) != want {
		t.Fatalf("%d shapes, want %d", len(shapes), want)
	}
	kpos := 0
	for i, run := range runs {
		sh := shapes[num(pos+i)-1]
		c := run[0]
		var limits []int64
		for _, b := range c.req.Buckets {
			limits = append(limits, int64(len(b.Limits)))
			for _, l := range b.Limits {
				limits = append(limits, l.Interval(), l.Burst)
			}
			limits = append(limits, b.Reserve)
		}
		want := shape{int64(len(c.req.Buckets)), c.req.N, int64(c.req.MaxWait), int64(len(run)), limits}
		if !reflect.DeepEqual(sh, want) {
			t.Fatalf("take %d reads as %+v, want %+v", i, sh, want)
		}
		for _, b := range c.req.Buckets {
			if keys[kpos] != b.StoreKey() {
				t.Fatalf("take %d: key %d is %q, want %q", i, kpos, keys[kpos], b.StoreKey())
			}
			kpos++
		}
	}
	if kpos != len(keys) {
		t.Fatalf("%d keys for %d", len(keys), kpos)
	}
}

// TestBoundArgs checks that a bound taker's lone take sends the arguments
// takeOne would send for the same request.
func TestBoundArgs(t *testing.T) {
	t.Parallel()
	for _, limits := range [][]fleetrate.Limit{
		{fleetrate.PerSecond(100, 1<<27)},
		{fleetrate.PerSecond(10, 5), fleetrate.PerPeriod(100, time.Minute)},
	} {
		b := fleetrate.Bucket{Prefix: "p:", Key: "k", Limits: limits}
		largs := appendTakeLimits(nil, []fleetrate.Bucket{b})
		for _, n := range []int64{0, 1, 300} {
			for _, wait := range []time.Duration{0, time.Second} {
				got, want := appendBoundArgs(nil, n, wait, largs), takeArgs(n, wait, []fleetrate.Bucket{b})
				if !reflect.DeepEqual(got, want) {
					t.Errorf("limits %v, n %d, wait %v: appendBoundArgs %v, takeArgs %v", limits, n, wait, got, want)
				}
			}
		}
	}
}
