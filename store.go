package fleetrate

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Callers branch on them with errors.Is.
var (
	// ErrStoreUnavailable wraps every failure of a store to answer (Redis
	// down, timed out, out of memory). It is never a denial: the caller
	// decides whether to fail open or closed.
	ErrStoreUnavailable = errors.New("fleetrate: store unavailable")
	// ErrBurstExceeded means n is larger than a limit's burst, so the take
	// could never succeed.
	ErrBurstExceeded = errors.New("fleetrate: n exceeds burst")
	// ErrBackpressure means a Wait or Reserve would have to wait longer than
	// its max wait (or its context's deadline). Nothing was booked. The error
	// is a *BackpressureError carrying the retry-after.
	ErrBackpressure = errors.New("fleetrate: wait exceeds max wait")
	// ErrInvalid wraps every rejected argument or configuration.
	ErrInvalid = errors.New("fleetrate: invalid")
)

// BackpressureError is returned when a wait would exceed the max wait. It
// unwraps to ErrBackpressure.
type BackpressureError struct {
	// RetryAfter is how long until the take would conform without waiting.
	RetryAfter time.Duration
	// MaxWait is the bound that was exceeded.
	MaxWait time.Duration
	// Result is the store's full answer.
	Result Result
}

// Error describes the wait and the bound it exceeded.
func (e *BackpressureError) Error() string {
	return fmt.Sprintf("fleetrate: wait of %v exceeds max wait %v", e.RetryAfter, e.MaxWait)
}

// Unwrap returns ErrBackpressure.
func (e *BackpressureError) Unwrap() error { return ErrBackpressure }

// Bucket names one stored token bucket and the limits it enforces.
type Bucket struct {
	// Prefix namespaces the key; the store key is Prefix + Key. It is kept
	// apart so that stores can look keys up without building the string.
	Prefix string
	// Key names the bucket within the prefix. It must not be empty.
	Key string
	// Limits are enforced together; at least one is required.
	Limits []Limit
	// Reserve is, for a take, how many tokens every limit of the bucket
	// must still hold after it: tokens kept for takes of a higher priority
	// (see Priority). The take conforms when its n tokens plus Reserve
	// are available, and books as any other take, so a bucket's bound
	// holds over all its takes together. 0, the default, keeps nothing
	// back: the top class. It must be below every limit's burst, and n +
	// Reserve at most it. For a refund it is the largest reserve any take
	// from the bucket uses (see Store.Refund); cancels, drains and resets
	// ignore it.
	Reserve int64
}

// compiled reports whether b is valid for a take of n tokens because its
// limits are a Limiter's validated copies.
func (b *Bucket) compiled(n int64) bool {
	if b.Key == "" || len(b.Limits) == 0 || b.Reserve < 0 {
		return false
	}
	for i := range b.Limits {
		if l := &b.Limits[i]; !l.cached() || n > l.Burst-b.Reserve || b.Reserve >= l.Burst {
			return false
		}
	}
	return true
}

// StoreKey returns the full store key, Prefix + Key.
func (b Bucket) StoreKey() string { return b.Prefix + b.Key }

// Request is one atomic take across one or more buckets.
type Request struct {
	// Buckets are taken from all or nothing.
	Buckets []Bucket
	// N is the cost in tokens; 0 peeks without consuming.
	N int64
	// MaxWait is how far in the future the take may be booked. 0 means
	// now or never (Allow).
	MaxWait time.Duration
	// Booking, when set, receives where a granted take of N > 0 left every
	// limit, so that the booking can be given back exactly with
	// Store.Cancel. Reserve and Wait set it; Allow does not, which keeps
	// its path free of allocations.
	Booking *Booking
}

// Booking records where a granted take left its buckets: the store's clock
// at the take and every limit's debt right after it, bucket by bucket in
// the order of the request, limit by limit. It is what Store.Cancel needs
// to give back only the tokens that no later booking relies on. Callers
// treat it as opaque.
type Booking struct {
	// Stamp is the store's clock at the take, µs since the Unix epoch.
	Stamp int64
	// Debts are the limits' debts (ns) after the take.
	Debts []int64
}

// Validate checks the request, naming the failing field.
func (r Request) Validate() error {
	if len(r.Buckets) == 1 && r.N >= 0 && r.MaxWait >= 0 && r.MaxWait <= MaxWaitCap && r.Buckets[0].compiled(r.N) {
		return nil // a Limiter's take from one bucket, the hot path
	}
	return r.validate()
}

// validate is Validate without the shortcut for a Limiter's requests.
func (r Request) validate() error {
	if len(r.Buckets) == 0 {
		return fmt.Errorf("%w: request: at least one bucket is required", ErrInvalid)
	}
	if r.N < 0 {
		return fmt.Errorf("%w: n must be >= 0, got %d", ErrInvalid, r.N)
	}
	if r.MaxWait < 0 || r.MaxWait > MaxWaitCap {
		return fmt.Errorf("%w: max wait must be between 0 and %v, got %v", ErrInvalid, MaxWaitCap, r.MaxWait)
	}
	for i, b := range r.Buckets {
		if err := validateBucket(i, b); err != nil {
			return err
		}
		for _, o := range r.Buckets[:i] {
			if o.StoreKey() == b.StoreKey() {
				return fmt.Errorf("%w: buckets[%d].key: %q appears twice", ErrInvalid, i, b.StoreKey())
			}
		}
		for _, l := range b.Limits {
			if b.Reserve < 0 || b.Reserve >= l.Burst {
				return fmt.Errorf("%w: buckets[%d] %q reserve: must be between 0 and burst-1 (%d), got %d", ErrInvalid, i, b.StoreKey(), l.Burst-1, b.Reserve)
			}
			if r.N > l.Burst {
				return fmt.Errorf("%w: n=%d, bucket %q burst %d", ErrBurstExceeded, r.N, b.Key, l.Burst)
			}
			if r.N > l.Burst-b.Reserve {
				return fmt.Errorf("%w: n=%d plus reserve %d, bucket %q burst %d", ErrBurstExceeded, r.N, b.Reserve, b.Key, l.Burst)
			}
		}
	}
	return nil
}

// ValidateBuckets checks buckets for a refund, drain or reset.
func ValidateBuckets(buckets []Bucket) error {
	if len(buckets) == 0 {
		return fmt.Errorf("%w: at least one bucket is required", ErrInvalid)
	}
	for i, b := range buckets {
		if err := validateBucket(i, b); err != nil {
			return err
		}
	}
	return nil
}

func validateBucket(i int, b Bucket) error {
	if b.Key == "" {
		return fmt.Errorf("%w: buckets[%d].key: must not be empty", ErrInvalid, i)
	}
	if len(b.Limits) == 0 {
		return fmt.Errorf("%w: buckets[%d] %q limits: at least one limit is required", ErrInvalid, i, b.StoreKey())
	}
	for j, l := range b.Limits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("%w: buckets[%d] %q limits[%d]: %w", ErrInvalid, i, b.StoreKey(), j, err)
		}
	}
	return nil
}

// Result is a store's decision. Durations are relative, so they mean the
// same on every machine whatever its clock says.
type Result struct {
	// Allowed reports whether the tokens were granted (possibly booked
	// Wait in the future).
	Allowed bool
	// N is the cost that was asked for.
	N int64
	// Remaining is how many tokens the tightest limit holds after this
	// decision (0 when it is in debt).
	Remaining int64
	// Wait is how long the caller must wait before acting on an allowed
	// reservation. It is 0 for Allow.
	Wait time.Duration
	// RetryAfter is, for a denial, how long until the same take would be
	// granted without waiting. It is 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until every limit is full again.
	ResetAfter time.Duration
	// Limit is the limit that decided: the one that denied, or for a grant
	// the one with the fewest tokens left.
	Limit Limit
	// Bucket is the index in Request.Buckets of the bucket holding Limit.
	Bucket int
	// LimitIndex is the index of Limit in that bucket's Limits.
	LimitIndex int
	// NextToken is how long until Limit holds one token more than it
	// holds after this decision (for a full limit, one interval: the
	// time its next token takes to come back once used). It is 0 when the
	// store does not know it, as for a degraded or leased grant.
	NextToken time.Duration
	// At is the store's clock when it decided. For Redis this is the
	// server's TIME, the one clock the whole fleet shares.
	At time.Time
	// Degraded is set when the shared store could not decide and a failure
	// policy did instead (see package failsafe): fail open, or a local
	// fallback bucket.
	Degraded bool
}

// Store keeps token buckets and applies the algorithm of gcra.Decide
// (package github.com/fleetrate/fleetrate/gcra) atomically.
// Implementations must be safe for concurrent use, must honour the
// context, must validate their arguments (errors wrap ErrInvalid or
// ErrBurstExceeded), and must report their own failures as errors wrapping
// ErrStoreUnavailable, never as denials. A key that has never been written
// is a full bucket. A store must not keep the slices it is given after the
// call returns: callers reuse them.
type Store interface {
	// Take applies a take (or a peek when N is 0) to every bucket in the
	// request, all or nothing, in one atomic step.
	Take(ctx context.Context, req Request) (Result, error)
	// Refund gives back n tokens of a grant made at at (the take's
	// Result.At, on the store's clock) that was never used, such as an
	// Allow whose work was not done: each limit of each bucket gets back
	// what time has not refilled since at, and nothing while a slot is
	// booked ahead on it or it is drained, so that no window grants more
	// than if the grant had never been made (see gcra.Refund). A bucket's
	// Reserve is the largest reserve a take from it uses (see Priority).
	// A booking made ahead is given back with Cancel.
	Refund(ctx context.Context, buckets []Bucket, n int64, at time.Time) error
	// Cancel gives back a booking of n tokens that a Take of these buckets
	// recorded in b (Request.Booking): each limit of each bucket gets the
	// tokens back only when nothing was booked on it since, so no later
	// booking's slot is granted twice (see gcra.Cancel). Buckets must be
	// the take's, in its order.
	Cancel(ctx context.Context, buckets []Bucket, n int64, b Booking) error
	// Drain empties every bucket until d from now; it then refills from
	// empty.
	Drain(ctx context.Context, buckets []Bucket, d time.Duration) error
	// Reset deletes the buckets, leaving them full.
	Reset(ctx context.Context, keys ...string) error
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

// ValidateRefund checks the arguments of Store.Refund: valid buckets, n
// between 0 and MaxBurst, and the grant's time.
func ValidateRefund(buckets []Bucket, n int64, at time.Time) error {
	if err := ValidateBuckets(buckets); err != nil {
		return err
	}
	if n < 0 || n > MaxBurst {
		return fmt.Errorf("%w: refund n must be between 0 and %d, got %d", ErrInvalid, int64(MaxBurst), n)
	}
	if at.IsZero() {
		return fmt.Errorf("%w: refund at: the grant's time (its Result.At) is required: without it a refund could give back tokens the bucket has refilled since", ErrInvalid)
	}
	return nil
}

// ValidateCancel checks the arguments of Store.Cancel: valid buckets, n at
// least 0, and a booking with one debt for every limit of the buckets.
func ValidateCancel(buckets []Bucket, n int64, b Booking) error {
	if err := ValidateBuckets(buckets); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("%w: cancel n must be >= 0, got %d", ErrInvalid, n)
	}
	m := 0
	for _, bk := range buckets {
		m += len(bk.Limits)
		for _, l := range bk.Limits {
			if n > l.Burst {
				// No take of more than a burst books anything.
				return fmt.Errorf("%w: cancel n must be at most the burst of every limit (a take of more books nothing), got %d for %s", ErrInvalid, n, l)
			}
		}
	}
	if len(b.Debts) != m {
		return fmt.Errorf("%w: cancel booking: %d debts for %d limits (a booking from another take?)", ErrInvalid, len(b.Debts), m)
	}
	return nil
}
