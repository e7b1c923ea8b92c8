package fleetrate

// The optional methods a Store may have, which a Limiter finds and uses.

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// PermitNotifier is an optional Store method. A store that can tell when
// a queued take's turn may have come (a permit it waits for was released)
// lets waiters sleep until then instead of until the next lease ends. A
// Limiter finds it on its store or on a store a wrapper unwraps to (an
// Unwrap() Store method).
type PermitNotifier interface {
	// NotifyPermit returns a channel that receives when a permit of the
	// bucket key may have been freed for the waiter id (it is first in
	// the queue), and a function that stops the notification. The
	// channel is buffered: a notice is never lost between two takes.
	NotifyPermit(key, id string) (<-chan struct{}, func())
}

// MultiClock is an optional Store method. A store whose results may be
// timed by more than one clock (Result.At read from the different masters
// of a Redis Cluster, or from several servers) reports it, and Limiters
// then count a booked wait from the store's answer instead of placing the
// store's decision on their own clock (which assumes one store clock).
type MultiClock interface {
	MultipleClocks() bool
}

// Binder is an optional Store method for the hot path of Allow and Peek.
// New binds the default limits of a Limiter, and the limits of each of its
// named buckets, once; Allow and Peek then take from one bucket through
// the bound taker, without building a Request or validating the limits on
// every call.
type Binder interface {
	// Bind returns a taker for the buckets under prefix that enforce
	// limits, or an error wrapping ErrInvalid when the limits are invalid.
	// The limits are a Limiter's own copies, never changed after the call,
	// so the store may keep them.
	Bind(prefix string, limits []Limit) (BoundTaker, error)
}

// BoundTaker takes from the buckets of one prefix and one list of limits.
// TakeKey(ctx, key, n, w) must be equivalent to Store.Take(ctx,
// Request{Buckets: []Bucket{{Prefix: prefix, Key: key, Limits: limits}},
// N: n, MaxWait: w}), argument checks included.
type BoundTaker interface {
	TakeKey(ctx context.Context, key string, n int64, maxWait time.Duration) (Result, error)
}

// MultiTaker is an optional Store method for the takes one caller makes
// at once and that do not depend on one another, such as the descriptors
// of one Envoy rate limit call: the store may send them in one round trip
// (redisstore runs them in one script call) rather than the caller
// sending each from a goroutine of its own. TakeMany uses it.
type MultiTaker interface {
	// TakeMany applies each of reqs as Take would, each all or nothing on
	// its own buckets and independently of the others (the order in which
	// they apply is the store's), and writes reqs[i]'s answer to res[i]
	// and errs[i]. res and errs have len(reqs) elements. The store may
	// keep nothing of reqs after it returns.
	TakeMany(ctx context.Context, reqs []Request, res []Result, errs []error)
}

// TakeMany applies each of reqs to s as s.Take would, independently of
// one another, and writes reqs[i]'s answer to res[i] and errs[i]: in one
// call when s is a MultiTaker, else each from a goroutine of its own, at
// the same time. It returns an error wrapping ErrInvalid, and applies
// nothing, when res or errs do not have one element for each request or
// ctx is nil; every element of errs is then that error too.
func TakeMany(ctx context.Context, s Store, reqs []Request, res []Result, errs []error) error {
	var err error
	switch {
	case len(res) != len(reqs) || len(errs) != len(reqs):
		err = fmt.Errorf("%w: TakeMany: %d requests need as many results and errors, got %d and %d", ErrInvalid, len(reqs), len(res), len(errs))
	case ctx == nil:
		err = errNilContext
	}
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return err
	}
	if m, ok := s.(MultiTaker); ok {
		m.TakeMany(ctx, reqs, res, errs)
		return nil
	}
	TakeEach(ctx, s, reqs, res, errs)
	return nil
}

// TakeEach is TakeMany for a store that is not a MultiTaker, or a
// MultiTaker's own fallback: each request from a goroutine of its own
// (the last one from the caller's), so that the takes wait for their
// round trips at the same time.
func TakeEach(ctx context.Context, s Store, reqs []Request, res []Result, errs []error) {
	if len(reqs) == 0 {
		return
	}
	var wg sync.WaitGroup
	last := len(reqs) - 1
	for i := range reqs[:last] {
		wg.Go(func() { res[i], errs[i] = s.Take(ctx, reqs[i]) })
	}
	res[last], errs[last] = s.Take(ctx, reqs[last])
	wg.Wait()
}
