package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Take implements fleetrate.Store.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	res, err := s.take(ctx, req)
	return res, s.explain(err)
}

var _ fleetrate.MultiTaker = (*Store)(nil)

// TakeMany implements fleetrate.MultiTaker: with batching (the default)
// the takes queue at once and go out together, most often in one script
// call. Otherwise, or for takes with costs by bucket, in-flight permits
// or quotas, or while a store that guards failovers
// (Options.EmptyAfterFailover) empties buckets on a new master, each is
// sent as Take sends it, from a goroutine of its own; a take that finds
// the master changed under it is sent again as Take would.
func (s *Store) TakeMany(ctx context.Context, reqs []fleetrate.Request, res []fleetrate.Result, errs []error) {
	if s.batch == nil || s.fo != nil && !s.fo.steady() || slices.ContainsFunc(reqs, func(r fleetrate.Request) bool { return extended(&r) }) {
		fleetrate.TakeEach(ctx, s, reqs, res, errs)
		return
	}
	for i := range reqs {
		errs[i] = reqs[i].Validate() // a bad one keeps its error; the rest go out together
	}
	s.batch.takeMany(ctx, reqs, res, errs)
	for i := range errs {
		if s.fo != nil {
			switch {
			case errs[i] == nil:
				s.fo.record(reqs[i].Buckets, res[i])
			case errors.Is(errs[i], errSwitched):
				res[i], errs[i] = s.take(ctx, reqs[i]) // empties the buckets on the new master first
			}
		}
		if errs[i] = s.explain(errs[i]); errs[i] != nil {
			res[i] = fleetrate.Result{}
		}
	}
}

// explain adds to a store failure that timed out the latest failed dial
// to the store's Redis, if one failed in the last few seconds: a client
// built with ClientOptions dials in the background while the call waits,
// so the call's own error says only that its deadline passed.
func (s *Store) explain(err error) error {
	if err == nil || len(s.addrs) == 0 || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		return err
	}
	if cause := dialCause(s.addrs); cause != "" {
		return fmt.Errorf("%w (%s)", err, cause)
	}
	return err
}

// take is Take for a validated request.
func (s *Store) take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if s.fo != nil {
		return s.fo.take(ctx, s, req, s.route)
	}
	return s.route(ctx, req)
}

// route sends a take through its batcher, or on its own; a take with
// costs by bucket or in-flight permits always on its own (see extended).
func (s *Store) route(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if extended(&req) {
		return s.takeExt(ctx, req)
	}
	if q := s.queue(req.N); q != nil {
		return q.take(ctx, req)
	}
	return s.takeOne(ctx, req)
}

// queue returns the batcher a take of n tokens shares calls through, or
// nil when it makes its own call.
func (s *Store) queue(n int64) sharer {
	if s.batch != nil {
		return s.batch
	}
	if s.fold != nil && n > 0 {
		return s.fold
	}
	return nil
}

// Bind implements fleetrate.Binder: a Limiter's Allow and Peek then skip
// building and checking a request of their own, and a batched take copies
// nothing but its key.
func (s *Store) Bind(prefix string, limits []fleetrate.Limit) (fleetrate.BoundTaker, error) {
	b := fleetrate.Bucket{Prefix: prefix, Key: "*", Limits: slices.Clone(limits)}
	if err := fleetrate.ValidateBuckets([]fleetrate.Bucket{b}); err != nil {
		return nil, err
	}
	largs := appendTakeLimits(nil, []fleetrate.Bucket{b})
	return &bound{s: s, b: b, largs: largs}, nil
}

// bound is a Store bound to one prefix and one list of validated limits.
type bound struct {
	s     *Store
	b     fleetrate.Bucket // Key is set per take
	largs []any            // b's limits as script arguments
}

// TakeKey implements fleetrate.BoundTaker.
func (t *bound) TakeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (fleetrate.Result, error) {
	res, err := t.takeKey(ctx, key, n, maxWait)
	return res, t.s.explain(err)
}

// takeKey is TakeKey before its error is explained.
func (t *bound) takeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (fleetrate.Result, error) {
	if q := t.s.queue(n); q != nil && t.s.fo == nil {
		return q.takeKey(ctx, t.b, key, n, maxWait, t.largs)
	}
	b := t.b
	b.Key = key
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: n, MaxWait: maxWait}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	if t.s.fo != nil {
		return t.s.take(ctx, req)
	}
	return t.s.takeOne(ctx, req)
}

// takeOne runs one take of an already validated request in one call of
// the take script.
func (s *Store) takeOne(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	c := s.boundCall(ctx)
	keys := c.key[:]
	if len(req.Buckets) == 1 {
		c.key[0] = req.Buckets[0].StoreKey()
	} else {
		keys = storeKeys(req.Buckets)
		if err := s.sameSlot(keys); err != nil {
			c.release()
			return fleetrate.Result{}, err
		}
	}
	c.args = appendTakeArgs(c.args, req.N, req.MaxWait, req.Buckets)
	return s.sendTake(ctx, c, req, keys)
}

// boundCall returns the context, bounded by the store's timeout, and the
// scratch of one call made for a caller whose context is ctx.
func (s *Store) boundCall(ctx context.Context) *callCtx {
	return boundCall(ctx, s.timeout)
}

// sendTake sends one call of the take script for req, with c's
// arguments and keys, and releases c.
func (s *Store) sendTake(ctx context.Context, c *callCtx, req fleetrate.Request, keys []string) (fleetrate.Result, error) {
	defer c.release() // after the decision: req may be in c's scratch
	reply, err := s.runTake(c.context(), keys, c.args)
	if err != nil {
		return fleetrate.Result{}, failed(ctx, "take", err)
	}
	return decodeTake(req, reply)
}

// runTake runs the take script once within ctx. The reply is read only
// on success: an abandoned call (see bounded) may still write it.
func (s *Store) runTake(ctx context.Context, keys []string, args []any) ([]int64, error) {
	if s.direct {
		return s.eval(ctx, takeScript, keys, args...).Int64Slice()
	}
	var reply []int64
	err := s.bounded(ctx, func(ctx context.Context) (err error) {
		reply, err = s.eval(ctx, takeScript, keys, args...).Int64Slice()
		return err
	})
	if err != nil {
		return nil, err
	}
	return reply, nil
}

// sameSlot checks, on a Cluster, that the keys of one atomic call share a
// hash slot, so that a caller's mistake is an ErrInvalid naming the keys,
// not a CROSSSLOT failure reported as an unavailable store.
func (s *Store) sameSlot(keys []string) error {
	if !s.cluster || len(keys) < 2 {
		return nil
	}
	first := Slot(keys[0])
	for _, k := range keys[1:] {
		if Slot(k) != first {
			return fmt.Errorf("%w: keys %q and %q are on different Redis Cluster slots; give buckets taken together a common {hash tag}", fleetrate.ErrInvalid, keys[0], k)
		}
	}
	return nil
}

// storeKeys returns each bucket's store key.
func storeKeys(buckets []fleetrate.Bucket) []string {
	keys := make([]string, len(buckets))
	for i, b := range buckets {
		keys[i] = b.StoreKey()
	}
	return keys
}
