// Package lease serves a hot bucket's takes from tokens a process has taken
// from the shared store in advance, so that one store call grants several
// takes.
//
// A Store wraps a shared fleetrate.Store. A take of n tokens now (MaxWait 0,
// one bucket: a Limiter's Allow) is served from the process's lease of that
// bucket while it holds n tokens and is younger than MaxAge; otherwise the
// take asks the shared store for a new lease of Tokens tokens, keeps what
// it does not use, and returns the first of them. When the bucket holds
// fewer than Tokens tokens, the lease is refused and takes go to the shared
// store one by one, exactly as without a lease, until one of them finds
// Tokens tokens left. Every other take (waits, peeks, several buckets, more than
// Tokens tokens, takes of a lower priority class, which must see the
// bucket's reserve) goes to the shared store unchanged.
//
// Every leased token was granted by the shared bucket, so the fleet never
// spends more tokens than the bucket allows; a lease only moves tokens in
// time, from the moment the bucket granted them to the moment a caller
// spends them, at most MaxAge later. The worst case, with P processes
// leasing one bucket of burst b and rate r: in any window of length w the
// fleet spends at most
//
//	b + r·w + min(P·(Tokens−1), r·MaxAge)
//
// tokens, against b + r·w without leases (the tests check this bound). Set
// Tokens and MaxAge from the overshoot the upstream tolerates. The tokens
// left in a lease that expires (or holds fewer than a take asks for) go
// back to the bucket (one Refund call: as far as time has not refilled
// the bucket since the lease, and not while a slot is booked ahead on it)
// at the next take of that bucket, before a new lease; those of a bucket
// never taken from again stay spent. A saturated bucket gains nothing from leases (it rarely
// holds Tokens tokens) and costs what it costs without them: one store
// call per take.
package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
)

// Defaults applied when an Options field is zero.
const (
	DefaultMaxAge  = 100 * time.Millisecond
	DefaultMaxKeys = 10_000
)

// Options configure a Store.
type Options struct {
	// Tokens is how many tokens one lease takes from the shared bucket:
	// at least 2 (1 would be no lease). Required. A bucket whose burst (less
	// its reserve) is below Tokens never grants a lease: its takes go to
	// the shared store alone, as without the lease.
	Tokens int64
	// MaxAge is how long after the shared store granted a lease its
	// tokens may be spent. Default DefaultMaxAge (100 ms).
	MaxAge time.Duration
	// MaxKeys bounds the buckets holding a lease at once; takes of other
	// buckets go to the shared store unchanged. Default DefaultMaxKeys.
	MaxKeys int
	// Clock is the time source that ages leases and stamps the results
	// of leased takes. Default time.Now.
	Clock func() time.Time
}

// Store is a fleetrate.Store that serves takes from local leases. It is
// safe for concurrent use.
type Store struct {
	inner fleetrate.Store
	opts  Options

	mu     sync.Mutex
	leases map[string]*lease
}

var _ fleetrate.Store = (*Store)(nil)

// Unwrap returns the shared store that s leases from, so that callers can
// find what it offers beyond fleetrate.Store: a transport over a Limiter
// on s finds the shared store's Announcer through it and keeps telling
// the fleet of its pauses (see transport.Announcer).
func (s *Store) Unwrap() fleetrate.Store { return s.inner }

// lease is one bucket's leased tokens. sem (a lock that a waiting caller
// can give up on) guards the rest: one caller at a time asks the shared
// store for a new lease while the others of the bucket wait for it.
type lease struct {
	sem    chan struct{}
	limits []fleetrate.Limit
	left   int64     // tokens not yet spent
	until  time.Time // tokens may be spent before then
	// lean is set when the bucket refused a lease: takes then go to the
	// shared store one by one until one of them finds Tokens tokens left.
	lean atomic.Bool
	// granted is the shared store's result for the lease, which leased
	// takes report their limit and bucket from, and whose At its leftover
	// tokens are refunded as of (see giveBack).
	granted fleetrate.Result
}

// leaseWait is how long a take waits for the caller that is renewing its
// bucket's lease before it takes from the shared store on its own.
const leaseWait = 5 * time.Millisecond

// New wraps inner.
func New(inner fleetrate.Store, opts Options) (*Store, error) {
	switch {
	case inner == nil:
		return nil, fmt.Errorf("%w: lease: inner store must not be nil", fleetrate.ErrInvalid)
	case opts.Tokens < 2:
		return nil, fmt.Errorf("%w: lease: tokens must be at least 2, got %d", fleetrate.ErrInvalid, opts.Tokens)
	case opts.MaxAge < 0:
		return nil, fmt.Errorf("%w: lease: max age must not be negative, got %v", fleetrate.ErrInvalid, opts.MaxAge)
	case opts.MaxKeys < 0:
		return nil, fmt.Errorf("%w: lease: max keys must not be negative, got %d", fleetrate.ErrInvalid, opts.MaxKeys)
	}
	if opts.MaxAge == 0 {
		opts.MaxAge = DefaultMaxAge
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	return &Store{inner: inner, opts: opts, leases: map[string]*lease{}}, nil
}

// Take implements fleetrate.Store.
func (s *Store) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	if !s.leasable(req) {
		return s.inner.Take(ctx, req)
	}
	if err := req.Validate(); err != nil {
		return fleetrate.Result{}, err
	}
	l := s.lease(req.Buckets[0].StoreKey())
	if l == nil {
		return s.inner.Take(ctx, req)
	}
	if held, err := l.acquire(ctx); err != nil {
		return fleetrate.Result{}, err
	} else if !held {
		return s.inner.Take(ctx, req)
	}
	now := s.opts.Clock()
	// Serve from the lease while it holds the tokens, is young enough and
	// was leased under these limits. (Inline: as a function returning the
	// Result it cost the leased take about 10 % in CPU time.)
	if l.left >= req.N && now.Before(l.until) && slices.Equal(l.limits, req.Buckets[0].Limits) {
		l.left -= req.N
		// At is the lease's, on the store's clock: the shared store granted
		// these tokens then, and a settle names the take by it (its leads
		// after it bound what goes back: see fleetrate.Store.Settle).
		res := fleetrate.Result{
			Allowed: true, N: req.N, Remaining: l.left,
			Limit: l.granted.Limit, Bucket: l.granted.Bucket, LimitIndex: l.granted.LimitIndex, At: l.granted.At, Degraded: l.granted.Degraded,
		}
		l.release()
		return res, nil
	}
	s.giveBack(ctx, l, req.Buckets[0])
	if l.lean.Load() {
		l.release()
		return s.takeLean(ctx, l, req)
	}
	return s.renew(ctx, l, req, now)
}

// leasable reports whether a lease may serve req: a take of 1 to Tokens
// tokens now from one bucket, without a booking or a reserve.
func (s *Store) leasable(req fleetrate.Request) bool {
	return len(req.Buckets) == 1 && req.N >= 1 && req.N <= s.opts.Tokens && req.MaxWait == 0 && req.Booking == nil && req.Buckets[0].Reserve == 0 && req.Costs == nil && req.Buckets[0].InFlight == 0 && len(req.Buckets[0].Quotas) == 0
}

// acquire takes l.sem. When another caller holds it, asking the shared
// store for a new lease, it waits only briefly: past leaseWait it reports
// false and the take goes to the shared store alone, as without a lease, so
// that a slow or hung store bounds this decision by its own timeout, not by
// every holder queued ahead.
func (l *lease) acquire(ctx context.Context) (bool, error) {
	select {
	case l.sem <- struct{}{}:
		return true, nil
	default:
		return l.wait(ctx)
	}
}

// wait is acquire while another caller holds l.sem.
func (l *lease) wait(ctx context.Context) (bool, error) {
	t := time.NewTimer(leaseWait)
	defer t.Stop()
	select {
	case l.sem <- struct{}{}:
		return true, nil
	case <-ctx.Done():
		return false, fmt.Errorf("lease: %w", ctx.Err())
	case <-t.C:
		return false, nil
	}
}

func (l *lease) release() { <-l.sem }

// renew asks the shared store for a new lease of Tokens tokens while
// holding l, so that the bucket's other callers wait for it rather than
// each asking for one, and serves req from it. A bucket that refuses the
// lease turns l lean and req goes to the shared store alone. renew
// releases l.
func (s *Store) renew(ctx context.Context, l *lease, req fleetrate.Request, now time.Time) (fleetrate.Result, error) {
	lreq := req
	lreq.N = s.opts.Tokens
	res, err := s.inner.Take(ctx, lreq)
	switch {
	case err == nil && res.Allowed:
		l.limits = slices.Clone(req.Buckets[0].Limits)
		l.left = s.opts.Tokens - req.N
		l.until = now.Add(s.opts.MaxAge)
		l.granted = res
		res.N, res.Remaining = req.N, res.Remaining+l.left
		l.release()
		return res, nil
	case err == nil, errors.Is(err, fleetrate.ErrBurstExceeded):
		// Fewer than Tokens tokens, or a burst below Tokens.
		l.lean.Store(true)
		l.release()
		return s.takeLean(ctx, l, req)
	}
	l.release()
	return fleetrate.Result{}, err
}

// takeLean is a take that goes to the shared store alone, while the bucket
// holds too few tokens for a lease; once one finds Tokens tokens left, the
// next take leases again. A saturated bucket so costs one store call per
// take, as without leases, and no call to try a lease.
func (s *Store) takeLean(ctx context.Context, l *lease, req fleetrate.Request) (fleetrate.Result, error) {
	res, err := s.inner.Take(ctx, req)
	if err == nil && res.Remaining >= s.opts.Tokens {
		l.lean.Store(false)
	}
	return res, err
}

// lease returns the lease of the bucket stored under key, making it if
// needed, or nil when MaxKeys buckets hold one already.
func (s *Store) lease(key string) *lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.leases[key]; l != nil {
		return l
	}
	if len(s.leases) >= s.opts.MaxKeys {
		s.sweep()
		if len(s.leases) >= s.opts.MaxKeys {
			return nil
		}
	}
	l := &lease{sem: make(chan struct{}, 1)}
	s.leases[key] = l
	return l
}

// sweep forgets the leases that hold no tokens that can be spent and are
// not in use (the tokens of an expired one stay spent). The caller holds
// s.mu.
func (s *Store) sweep() {
	now := s.opts.Clock()
	for key, l := range s.leases {
		select {
		case l.sem <- struct{}{}:
			if l.left == 0 || !now.Before(l.until) {
				delete(s.leases, key)
			}
			<-l.sem
		default: // in use
		}
	}
}

// giveBack returns the tokens left in l to the shared bucket before l is
// replaced (it expired, holds fewer tokens than the take asks for, or was
// leased under other limits). They go back as a refund of the lease's
// grant, made at its Result.At: each limit gets back what time has
// not refilled since, and nothing while a slot is booked ahead on it (see
// fleetrate.Store.Refund). It is best effort: tokens it fails to return
// stay spent. The caller holds l.sem.
func (s *Store) giveBack(ctx context.Context, l *lease, b fleetrate.Bucket) {
	if l.left == 0 {
		return
	}
	bs := []fleetrate.Bucket{{Prefix: b.Prefix, Key: b.Key, Limits: l.limits}}
	_ = s.inner.Refund(ctx, bs, l.left, l.granted.At)
	l.left = 0
}

// Refund implements fleetrate.Store.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	return s.inner.Refund(ctx, buckets, n, at)
}

// Cancel implements fleetrate.Store.
func (s *Store) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	return s.inner.Cancel(ctx, buckets, n, b)
}

// Drain implements fleetrate.Store. It also ends the leases of the
// buckets, whose tokens a drain takes back.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	for _, b := range buckets {
		s.forget(b.StoreKey())
	}
	return s.inner.Drain(ctx, buckets, d)
}

// Reset implements fleetrate.Store. It also ends the leases of the
// buckets.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	s.forget(keys...)
	return s.inner.Reset(ctx, keys...)
}

// forget drops the leases of keys with their tokens.
func (s *Store) forget(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.leases, k)
	}
}

// MultipleClocks implements fleetrate.MultiClock for the inner store.
func (s *Store) MultipleClocks() bool {
	mc, ok := s.inner.(fleetrate.MultiClock)
	return ok && mc.MultipleClocks()
}
