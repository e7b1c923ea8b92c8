package fleetrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	// InFlight, when above 0, bounds how many permits of the bucket may be
	// held at once across the fleet: a take from it acquires a permit
	// (Request.Permit) together with its tokens, and Store.Release gives
	// it back. 0, the default, bounds nothing. At most MaxInFlight.
	InFlight int64
	// PermitReserve is, for a take of a lower priority class, how many of
	// InFlight's permits it leaves free for the classes above: it is
	// admitted when the permits held, the waiters ahead of it of its class
	// or above (a PermitReserve no larger) and PermitReserve together stay
	// below InFlight. A waiter of a lower class never holds back a take of
	// a higher one. 0, the default, is the top class. Below InFlight.
	PermitReserve int64
	// Quotas are the bucket's calendar quotas (see Quota), enforced
	// together with Limits; each of a different Period.
	Quotas []Quota
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
	return b.InFlight == 0 && len(b.Quotas) == 0
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
	// Costs, when set, are the cost of each bucket, in the order of
	// Buckets: "1 request and 1,200 tokens" from a requests bucket and a
	// tokens bucket, all or nothing. N must then be 0, and Result.N is the
	// cost of the bucket that decided. When nil, every bucket costs N.
	Costs []int64
	// Booking, when set, receives where a granted take of N > 0 left every
	// limit, so that the booking can be given back exactly with
	// Store.Cancel. Reserve and Wait set it; Allow does not, which keeps
	// its path free of allocations.
	Booking *Booking
	// Permit, when its ID is set, acquires a permit of every bucket that
	// bounds in-flight takes (Bucket.InFlight), all or nothing with the
	// tokens. A take that costs tokens from such a bucket must carry one.
	// With MaxWait above 0, a take that finds no permit free waits in the
	// bucket's queue, first come first served (Result.InFlight.Queued),
	// and takes again when a permit frees (see PermitNotifier).
	Permit Permit
}

// Permit names a holder of in-flight permits and its lease.
type Permit struct {
	// ID names the holder: unique to one acquisition across the fleet
	// (a Limiter makes one), 1 to MaxPermitIDLen bytes of printable ASCII
	// without spaces.
	ID string
	// TTL is the lease, on the store's clock: the permit (or the place in
	// the queue) lapses TTL after the take, or after the last Store.Renew,
	// unless it is released first. Between MinPermitTTL and MaxPermitTTL.
	TTL time.Duration
}

// Bounds of the in-flight permits a store keeps.
const (
	// MaxInFlight is the largest Bucket.InFlight.
	MaxInFlight = 1 << 16
	// MaxPermitIDLen is the longest Permit.ID.
	MaxPermitIDLen = 128
	// MinPermitTTL is the shortest permit lease: a holder renews at a
	// third of it, and a store call may take a good part of a second
	// under load.
	MinPermitTTL = time.Second
	// MaxPermitTTL is the longest permit lease.
	MaxPermitTTL = time.Hour
)

// Validate checks a permit's id and lease, naming the failing field.
func (p Permit) Validate() error {
	if p.ID == "" || len(p.ID) > MaxPermitIDLen {
		return fmt.Errorf("%w: permit.id: must be 1 to %d bytes, got %d", ErrInvalid, MaxPermitIDLen, len(p.ID))
	}
	for i := 0; i < len(p.ID); i++ {
		if c := p.ID[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: permit.id: %q has byte %#x at %d: printable ASCII without spaces only", ErrInvalid, p.ID, c, i)
		}
	}
	if p.TTL < MinPermitTTL || p.TTL > MaxPermitTTL {
		return fmt.Errorf("%w: permit.ttl: must be between %v and %v (the holder renews at a third of it), got %v", ErrInvalid, MinPermitTTL, MaxPermitTTL, p.TTL)
	}
	return nil
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
	// Costs are the take's Request.Costs (nil: every bucket cost N).
	Costs []int64
}

// CostOf returns what a take of n tokens, or of costs by bucket when set,
// cost bucket i.
func CostOf(n int64, costs []int64, i int) int64 {
	if costs != nil {
		return costs[i]
	}
	return n
}

// Validate checks the request, naming the failing field.
func (r Request) Validate() error {
	if len(r.Buckets) == 1 && r.N >= 0 && r.MaxWait >= 0 && r.MaxWait <= MaxWaitCap && r.Costs == nil && r.Permit.ID == "" && r.Buckets[0].compiled(r.N) {
		return nil // a Limiter's take from one bucket, the hot path
	}
	return r.validate()
}

// validateCost checks a cost of n from bucket i, b, against its reserve,
// its limits' bursts and its quotas' counts.
func validateCost(i int, b Bucket, n int64) error {
	for _, l := range b.Limits {
		if b.Reserve < 0 || b.Reserve >= l.Burst {
			return fmt.Errorf("%w: buckets[%d] %q reserve: must be between 0 and burst-1 (%d), got %d", ErrInvalid, i, b.StoreKey(), l.Burst-1, b.Reserve)
		}
		if n > l.Burst {
			return fmt.Errorf("%w: n=%d, bucket %q burst %d", ErrBurstExceeded, n, b.Key, l.Burst)
		}
		if n > l.Burst-b.Reserve {
			return fmt.Errorf("%w: n=%d plus reserve %d, bucket %q burst %d", ErrBurstExceeded, n, b.Reserve, b.Key, l.Burst)
		}
	}
	for _, q := range b.Quotas {
		if n > q.Count {
			return fmt.Errorf("%w: n=%d, bucket %q quota %s of %d", ErrBurstExceeded, n, b.Key, q.label(), q.Count)
		}
	}
	return nil
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
	if r.Costs != nil {
		if r.N != 0 {
			return fmt.Errorf("%w: n must be 0 when costs are set (each bucket's cost is in costs), got %d", ErrInvalid, r.N)
		}
		if len(r.Costs) != len(r.Buckets) {
			return fmt.Errorf("%w: costs: %d costs for %d buckets (one per bucket, in order)", ErrInvalid, len(r.Costs), len(r.Buckets))
		}
	}
	permits := false
	for i, b := range r.Buckets {
		if err := validateBucket(i, b); err != nil {
			return err
		}
		if err := unique(r.Buckets[:i], i, b); err != nil {
			return err
		}
		n := CostOf(r.N, r.Costs, i)
		if n < 0 {
			return fmt.Errorf("%w: costs[%d]: bucket %q cost must be >= 0, got %d", ErrInvalid, i, b.StoreKey(), n)
		}
		if err := validateCost(i, b, n); err != nil {
			return err
		}
		if b.InFlight > 0 {
			permits = true
			if r.Permit.ID == "" && n > 0 {
				return fmt.Errorf("%w: permit.id: bucket %q bounds in-flight takes (in_flight %d): a take of tokens from it needs a permit", ErrInvalid, b.StoreKey(), b.InFlight)
			}
		}
	}
	if r.Permit != (Permit{}) {
		if !permits {
			return fmt.Errorf("%w: permit: no bucket of the take bounds in-flight takes (in_flight is 0 on every bucket)", ErrInvalid)
		}
		if err := r.Permit.Validate(); err != nil {
			return err
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
		if err := unique(buckets[:i], i, b); err != nil {
			return err
		}
	}
	return nil
}

// unique reports a bucket that appears in before, which the stores take in
// one atomic step and so must see once.
func unique(before []Bucket, i int, b Bucket) error {
	for _, o := range before {
		if o.StoreKey() == b.StoreKey() {
			return fmt.Errorf("%w: buckets[%d].key: %q appears twice", ErrInvalid, i, b.StoreKey())
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
	if b.InFlight < 0 || b.InFlight > MaxInFlight {
		return fmt.Errorf("%w: buckets[%d] %q in_flight: must be between 1 and %d (0: no bound), got %d", ErrInvalid, i, b.StoreKey(), MaxInFlight, b.InFlight)
	}
	if b.PermitReserve < 0 || b.PermitReserve > 0 && b.PermitReserve >= b.InFlight {
		return fmt.Errorf("%w: buckets[%d] %q permit_reserve: must be between 0 and in_flight-1 (%d), got %d", ErrInvalid, i, b.StoreKey(), max(b.InFlight-1, 0), b.PermitReserve)
	}
	if len(b.Quotas) == 0 {
		return nil
	}
	return validateQuotas(fmt.Sprintf("buckets[%d] %q", i, b.StoreKey()), b.Quotas)
}

// validateQuotas checks the quotas of field: each valid, no period twice.
func validateQuotas(field string, qs []Quota) error {
	for j, q := range qs {
		if err := q.Validate(); err != nil {
			return fmt.Errorf("%s quotas[%d]: %w", field, j, err)
		}
		for _, o := range qs[:j] {
			if o.Key() == q.Key() {
				return fmt.Errorf("%w: %s quotas[%d]: period %q appears twice (one quota per period)", ErrInvalid, field, j, q.Key())
			}
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
	// N is the cost that was asked for: of the bucket that decided
	// (Bucket), when the take had Request.Costs.
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
	// InFlight is, when a bucket of the take bounds in-flight takes, where
	// the tightest such bucket stands after the decision.
	InFlight InFlight
	// Quotas are, when buckets of the take have calendar quotas, where
	// each stands after the decision, in the order of the buckets and
	// their quotas. When a quota refused the take, QuotaDenied is set and
	// Quotas[Quota] is the one that refused; otherwise Quota is the index
	// of the quota with the fewest remaining.
	Quotas      []QuotaStatus
	Quota       int
	QuotaDenied bool
}

// InFlight is where a bucket's in-flight bound stands after a decision.
type InFlight struct {
	// Bound is the bucket's Bucket.InFlight; 0 when no bucket of the take
	// bounds in-flight takes.
	Bound int64
	// Held is how many permits are held after the decision.
	Held int64
	// Bucket is the index in Request.Buckets of the bucket.
	Bucket int
	// Queued is set on a denial that left the take waiting in the
	// bucket's queue for a permit (a take with MaxWait above 0): it keeps
	// its place until its lease ends, and takes again when a permit frees
	// (see PermitNotifier). Ahead is how many wait before it.
	Queued bool
	Ahead  int
}

// ValidateRelease checks the arguments of Store.Release: valid buckets of
// which one at least bounds in-flight takes, and the permit's id.
func ValidateRelease(buckets []Bucket, id string) error {
	return ValidateRenew(buckets, Permit{ID: id, TTL: MinPermitTTL})
}

// ValidateRenew checks the arguments of Store.Renew: valid buckets of
// which one at least bounds in-flight takes, and the permit's id and lease.
func ValidateRenew(buckets []Bucket, p Permit) error {
	if err := ValidateBuckets(buckets); err != nil {
		return err
	}
	if !slices.ContainsFunc(buckets, func(b Bucket) bool { return b.InFlight > 0 }) {
		return fmt.Errorf("%w: permit: no bucket bounds in-flight takes (in_flight is 0 on every bucket)", ErrInvalid)
	}
	return p.Validate()
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
	// empty. It is DrainEach with one duration for every bucket.
	Drain(ctx context.Context, buckets []Bucket, d time.Duration) error
	// DrainEach drains each bucket for its own duration, all in one
	// atomic step: a drain with Void set also voids what was booked
	// beyond it, as Reset then Drain would in two steps.
	DrainEach(ctx context.Context, drains []Drain) error
	// Reset deletes the buckets, leaving them full, and frees their
	// permits.
	Reset(ctx context.Context, keys ...string) error
	// Settle adjusts a grant to what its work really cost, bucket by
	// bucket, in one atomic step: a limit charged less than the grant took
	// gets back the difference as far as no take decided after the grant
	// relies on it (at most the least lead of those takes, which the store
	// keeps per limit for the grants of the last two epochs, named by
	// their slot s.At: see gcra.Lead), or what Refund gives back when that
	// is more; a limit charged more owes the difference at once, which
	// pushes later slots back and is never refused, since the work is
	// done. A limit
	// owes at most its fill time plus MaxWaitCap: a charge beyond is
	// lost. So in every window between two grants' slots, the real costs
	// of its grants stay within burst + rate × window plus the
	// under-estimates of those not yet settled when the last of them was
	// decided (gcra.Settle). A bucket's Reserve is as for Refund.
	Settle(ctx context.Context, buckets []Bucket, s Settlement) error
	// Release gives back the permit id holds in every bucket that bounds
	// in-flight takes, and its place in their queues. Releasing a permit
	// that is not held (twice, or after its lease ended) changes nothing
	// and is no error. It returns how many of the buckets held a permit
	// for id.
	Release(ctx context.Context, buckets []Bucket, id string) (held int, err error)
	// Renew extends the lease of p.ID's permit, or of its place in the
	// queue, to p.TTL from now in every bucket that bounds in-flight
	// takes. It returns how many of them held or queued p.ID: fewer than
	// the buckets with a bound means a lease had lapsed, and that permit
	// may be another's now (the holder should stop or acquire again).
	Renew(ctx context.Context, buckets []Bucket, p Permit) (held int, err error)
}

// Drain is one bucket's part of Store.DrainEach.
type Drain struct {
	Bucket Bucket
	// For is how long from now the bucket admits nothing, between 0 and
	// MaxWaitCap; it then refills from empty.
	For time.Duration
	// Void, when set, voids the bookings beyond now+For: the bucket is
	// empty until then and no longer, where a drain never shortens a
	// debt. A fleet's pause that restarts a bucket from its end uses it.
	Void bool
}

// ValidateDrains checks the arguments of Store.DrainEach, naming the
// failing drain.
func ValidateDrains(drains []Drain) error {
	if len(drains) == 0 {
		return fmt.Errorf("%w: drain: at least one bucket is required", ErrInvalid)
	}
	for i, d := range drains {
		if err := validateBucket(i, d.Bucket); err != nil {
			return err
		}
		for _, o := range drains[:i] {
			if o.Bucket.StoreKey() == d.Bucket.StoreKey() {
				return fmt.Errorf("%w: drains[%d].key: %q appears twice", ErrInvalid, i, d.Bucket.StoreKey())
			}
		}
		if d.For < 0 || d.For > MaxWaitCap {
			return fmt.Errorf("%w: drains[%d] %q: duration must be between 0 and %v, got %v", ErrInvalid, i, d.Bucket.StoreKey(), MaxWaitCap, d.For)
		}
	}
	return nil
}
