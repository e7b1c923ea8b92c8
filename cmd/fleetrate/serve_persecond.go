package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server"
)

// perSecondStore keeps the buckets of per-second limits in a store of
// their own, as envoyproxy/ratelimit's REDIS_PERSECOND does, to spread the
// load over two Redis: a bucket goes to second when every one of its
// limits refills within a second (Burst/Rate at most 1 s: a limit of
// "unit: second", whose burst is its requests_per_unit), to main
// otherwise. A bucket so always lives in one store. A request whose
// buckets would go to both is refused: no store can take them together
// atomically. The /readyz probe asks both.
type perSecondStore struct {
	main, second fleetrate.Store
}

var _ fleetrate.Store = perSecondStore{}

// perSecond reports whether every limit of b refills within a second.
func perSecond(b fleetrate.Bucket) bool {
	for _, l := range b.Limits {
		if !(float64(l.Burst)/l.Rate <= 1) {
			return false
		}
	}
	return len(b.Limits) > 0
}

// errMixed is the error for buckets that would be split over the stores.
var errMixed = fmt.Errorf("%w: buckets of per-second limits (kept in the per-second store, REDIS_PERSECOND) and of other limits cannot be taken together", fleetrate.ErrInvalid)

// route returns the store of buckets.
func (p perSecondStore) route(buckets []fleetrate.Bucket) (fleetrate.Store, error) {
	if len(buckets) == 0 {
		return p.main, nil
	}
	second := perSecond(buckets[0])
	for _, b := range buckets[1:] {
		if perSecond(b) != second {
			return nil, errMixed
		}
	}
	if second {
		return p.second, nil
	}
	return p.main, nil
}

// Take takes from the store of the request's buckets; the readiness probe
// (server.ProbeKey) peeks both, and reports the first that fails.
func (p perSecondStore) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if len(req.Buckets) == 1 && req.Buckets[0].Key == server.ProbeKey {
		res, err := p.main.Take(ctx, req)
		if err != nil || res.Degraded {
			return res, err
		}
		return p.second.Take(ctx, req)
	}
	s, err := p.route(req.Buckets)
	if err != nil {
		return fleetrate.Result{}, err
	}
	return s.Take(ctx, req)
}

// Refund gives back to the store of buckets.
func (p perSecondStore) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	s, err := p.route(buckets)
	if err != nil {
		return err
	}
	return s.Refund(ctx, buckets, n, at)
}

// Cancel cancels a booking in the store of buckets.
func (p perSecondStore) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	s, err := p.route(buckets)
	if err != nil {
		return err
	}
	return s.Cancel(ctx, buckets, n, b)
}

// Drain drains buckets in their store.
func (p perSecondStore) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	s, err := p.route(buckets)
	if err != nil {
		return err
	}
	return s.Drain(ctx, buckets, d)
}

// DrainEach drains buckets in their store.
func (p perSecondStore) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	bs := make([]fleetrate.Bucket, len(drains))
	for i, d := range drains {
		bs[i] = d.Bucket
	}
	s, err := p.route(bs)
	if err != nil {
		return err
	}
	return s.DrainEach(ctx, drains)
}

// Settle settles a grant in the store of buckets.
func (p perSecondStore) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	s, err := p.route(buckets)
	if err != nil {
		return err
	}
	return s.Settle(ctx, buckets, st)
}

// Release gives a permit back in the store of buckets.
func (p perSecondStore) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	s, err := p.route(buckets)
	if err != nil {
		return 0, err
	}
	return s.Release(ctx, buckets, id)
}

// Renew renews a permit in the store of buckets.
func (p perSecondStore) Renew(ctx context.Context, buckets []fleetrate.Bucket, pm fleetrate.Permit) (int, error) {
	s, err := p.route(buckets)
	if err != nil {
		return 0, err
	}
	return s.Renew(ctx, buckets, pm)
}

// Reset deletes keys from both stores: a key names no limits, so either
// may hold it.
func (p perSecondStore) Reset(ctx context.Context, keys ...string) error {
	return errors.Join(p.main.Reset(ctx, keys...), p.second.Reset(ctx, keys...))
}

// withPerSecond returns main with the buckets of per-second limits routed
// to second, both closed by its close.
func withPerSecond(main, second serveStore) serveStore {
	return serveStore{
		store: perSecondStore{main: main.store, second: second.store},
		name:  main.name + " (per-second limits: " + second.name + ")",
		close: func() error { return errors.Join(main.close(), second.close()) },
	}
}

// envoyPerSecondURL builds the per-second store's URL from
// envoyproxy/ratelimit's REDIS_PERSECOND_* variables, which mirror the
// REDIS_* ones envoyRedisURL reads.
func envoyPerSecondURL(getenv func(string) string) (string, error) {
	u, err := envoyRedisURL(func(name string) string {
		if rest, ok := strings.CutPrefix(name, "REDIS_"); ok {
			return getenv("REDIS_PERSECOND_" + rest)
		}
		return getenv(name)
	})
	if err != nil {
		// Name the variables as the deployment spells them.
		return "", errors.New(strings.ReplaceAll(err.Error(), "REDIS_", "REDIS_PERSECOND_"))
	}
	return u, nil
}
