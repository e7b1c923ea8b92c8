package fleetrate

// The optional methods a Store may have, which a Limiter finds and uses.

import (
	"context"
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
