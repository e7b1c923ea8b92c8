package redisstore

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
)

// While a Redis Cluster slot migrates, Redis runs a command on several keys
// of the slot only when all of them exist on one node; otherwise it answers
// TRYAGAIN, and it does so until the slot has moved, seconds for a slot of
// many keys. A full bucket has no key, so a take of several buckets of one
// {hash tag} fails for the whole migration. A take of one bucket always
// works: go-redis follows the ASK redirect to wherever its key is.
//
// So an Allow (a take now or never, with no booking to keep) of several
// buckets on a Cluster is given half its time as one script; if that fails
// with TRYAGAIN (or ASK, go-redis's redirects spent) or runs out of its
// half, the take is made bucket by bucket, each one on its own, and a
// bucket that refuses gives the tokens of those before it back. No bucket
// ever grants more than its own limits allow, so no limit is exceeded;
// tokens given back after another take booked the bucket stay spent, which
// errs on the side of the upstream. For a second after a take met a
// migrating slot, such takes go bucket by bucket at once.
//
// Takes that book ahead (Wait, Reserve) cannot be split this way (each
// bucket would book its own instant), nor can batched or folded takes,
// which share one script: those still fail while their slot migrates with
// a key absent.

// splitFor is how long after a take met a migrating slot the store takes
// several buckets bucket by bucket at once, instead of spending half of each
// take's time on a script that fails.
const splitFor = time.Second

// splittable reports whether req may be taken bucket by bucket when its
// slot migrates (see above).
func (s *Store) splittable(req fleetrate.Request) bool {
	return s.cluster && len(req.Buckets) > 1 && req.N > 0 && req.MaxWait == 0 && req.Booking == nil
}

// takeMigrating takes req (splittable) within sctx, the store's bound on
// caller's call: in one script if it can, else bucket by bucket.
func (s *Store) takeMigrating(caller, sctx context.Context, req fleetrate.Request, keys []string, args []any) (fleetrate.Result, error) {
	if time.Now().UnixNano() >= s.migratingUntil.Load() {
		actx, cancel := firstHalf(sctx)
		reply, err := s.runTake(actx, keys, args)
		cancel()
		if err == nil {
			return decodeTake(req, reply)
		}
		if sctx.Err() != nil || !(migrating(err) || errors.Is(err, context.DeadlineExceeded)) {
			return fleetrate.Result{}, failed(caller, "take", err)
		}
		if migrating(err) {
			s.migratingUntil.Store(time.Now().Add(splitFor).UnixNano())
		}
	}
	res, err := s.takeSplit(sctx, req)
	if err != nil {
		return fleetrate.Result{}, failed(caller, "take", err)
	}
	return res, nil
}

// firstHalf returns a context that ends halfway to ctx's deadline, or ctx
// itself (with a no-op cancel) when it has none.
func firstHalf(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, time.Until(dl)/2)
}

// migrating reports whether err is what a take meets while its slot
// migrates: TRYAGAIN, or an ASK redirect left over when go-redis spent its
// redirects retrying TRYAGAIN.
func migrating(err error) bool {
	_, ask := redis.IsAskError(err)
	return ask || redis.IsTryAgainError(err)
}

// takeSplit takes req from each bucket on its own, in order. When one
// refuses, the grants before it are cancelled in the background and its
// refusal is the result. When all grant, the result is the tightest
// bucket's, as a single script reports it.
func (s *Store) takeSplit(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	grants := make([]splitGrant, 0, len(req.Buckets))
	out := fleetrate.Result{Allowed: true, N: req.N, Remaining: math.MaxInt64}
	for i := range req.Buckets {
		g := splitGrant{b: req.Buckets[i]}
		one := fleetrate.Request{Buckets: req.Buckets[i : i+1], N: req.N, Booking: &g.booking}
		keys, args := storeKeys(one.Buckets), takeArgs(one.N, 0, one.Buckets)
		reply, err := s.runTake(ctx, keys, args)
		var r fleetrate.Result
		if err == nil {
			r, err = decodeTake(one, reply)
		}
		if err != nil || !r.Allowed {
			s.cancelSplit(grants, req.N)
			r.Bucket = i
			return r, err
		}
		grants = append(grants, g)
		if r.Remaining < out.Remaining {
			out.Remaining, out.Limit, out.Bucket = r.Remaining, r.Limit, i
		}
		out.ResetAfter = max(out.ResetAfter, r.ResetAfter)
		if r.At.After(out.At) {
			out.At = r.At
		}
	}
	return out, nil
}

// splitGrant is one bucket's grant in a take made bucket by bucket.
type splitGrant struct {
	b       fleetrate.Bucket
	booking fleetrate.Booking
}

// cancelSplit gives back, in the background, the grants of a take made
// bucket by bucket that a later bucket refused: best effort, bounded by a
// second.
func (s *Store) cancelSplit(grants []splitGrant, n int64) {
	if len(grants) == 0 {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for i := len(grants) - 1; i >= 0; i-- {
			_ = s.Cancel(ctx, []fleetrate.Bucket{grants[i].b}, n, grants[i].booking)
		}
	}()
}
