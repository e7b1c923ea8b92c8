package failsafe

import (
	"context"
	"time"

	"github.com/fleetrate/fleetrate"
)

var _ fleetrate.Binder = (*Store)(nil)

// Bind implements fleetrate.Binder: a Limiter over the Store takes through
// the primary store's bound taker (when it has one) behind the breaker and
// the policy, so that wrapping a store does not cost it its hot path.
func (s *Store) Bind(prefix string, limits []fleetrate.Limit) (fleetrate.BoundTaker, error) {
	t := &boundTaker{s: s, prefix: prefix, limits: limits}
	if b, ok := s.primary.(fleetrate.Binder); ok && !s.opts.EmptyAfterOutage {
		// EmptyAfterOutage drains a bucket before its first take after an
		// outage, which only Take does.
		inner, err := b.Bind(prefix, limits)
		if err != nil {
			return nil, err
		}
		t.inner = inner
	}
	return t, nil
}

// boundTaker takes from one prefix and list of limits through the Store.
type boundTaker struct {
	s      *Store
	prefix string
	limits []fleetrate.Limit
	inner  fleetrate.BoundTaker // the primary's, or nil: then Store.Take
}

// TakeKey implements fleetrate.BoundTaker.
func (t *boundTaker) TakeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (fleetrate.Result, error) {
	if t.inner == nil {
		return t.s.Take(ctx, t.request(key, n, maxWait))
	}
	var res fleetrate.Result
	ok, err := t.s.call(ctx, func() (err error) {
		res, err = t.inner.TakeKey(ctx, key, n, maxWait)
		return err
	})
	if ok {
		return res, err
	}
	return t.s.degrade(ctx, t.request(key, n, maxWait), err)
}

func (t *boundTaker) request(key string, n int64, maxWait time.Duration) fleetrate.Request {
	return fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: t.prefix, Key: key, Limits: t.limits}}, N: n, MaxWait: maxWait}
}
