package fleetrate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Acquire takes one token and an in-flight permit from every named bucket
// (see BucketConfig.InFlight), all or nothing, and returns once both are
// granted and the token's slot has come. When no permit is free it waits
// in the buckets' queue, first come first served, within the max wait
// (and ctx's deadline): a release wakes the first waiter only, on stores
// that can tell (PermitNotifier), and waiters never poll faster than a
// third of the permit's lease. Beyond the bound it fails with a
// *BackpressureError. The Reservation holds the permit, renewed by the
// Limiter, until Release: call it when the work ends, even when it failed.
func (l *Limiter) Acquire(ctx context.Context, names ...string) (*Reservation, error) {
	return l.WaitCosts(ctx, ones(names)...)
}

// TryAcquire is Acquire now or never: a denial (no token, or no permit
// free) is a Reservation whose Result.Allowed is false, and the take never
// jumps the queue of those waiting for a permit.
func (l *Limiter) TryAcquire(ctx context.Context, names ...string) (*Reservation, error) {
	return l.AllowCosts(ctx, ones(names)...)
}

// ones is a cost of one token from each named bucket.
func ones(names []string) []Cost {
	cs := make([]Cost, len(names))
	for i, n := range names {
		cs[i] = Cost{Bucket: n, N: 1}
	}
	return cs
}

// wait books req, waiting for a permit in the queue when it carries one,
// and sleeps until the booked slot. The wait is bounded by the max wait
// and ctx's deadline, counted from the call.
func (l *Limiter) wait(ctx context.Context, req Request) (*Reservation, error) {
	r, err := l.queue(ctx, req, l.maxWait)
	if err != nil {
		return nil, err
	}
	if err := r.Sleep(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// queue books req, each take at most horizon ahead, and while no permit
// is free waits in the buckets' queue for one: it takes again when a
// permit frees (on stores that tell), when a held lease may have ended,
// or to renew its place, until the limiter's max wait (or ctx's deadline,
// when sooner) from the call. The granted Reservation holds the permit.
func (l *Limiter) queue(ctx context.Context, req Request, horizon time.Duration) (*Reservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(l.maxWait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	var wake <-chan struct{}
	stop, joined := func() {}, false
	defer func() { stop() }()
	for {
		req.MaxWait = min(horizon, max(time.Until(deadline), 0))
		r, err := l.book(ctx, req)
		if err == nil {
			r.hold(req)
			return r, nil
		}
		if !queued(err) {
			if joined {
				l.leave(req) // its place in the queue, taken before
			}
			return nil, err
		}
		if !joined {
			l.permits.waiting.Add(1)
			defer l.permits.waiting.Add(-1)
		}
		joined = true
		res := err.(*BackpressureError).Result
		if wake == nil {
			if n := NotifierOf(l.store); n != nil {
				wake, stop = n.NotifyPermit(req.Buckets[res.InFlight.Bucket].StoreKey(), req.Permit.ID)
			}
		}
		// Take again when a permit frees, when a held lease may have
		// ended, or to renew the place in the queue.
		d := min(res.RetryAfter, req.Permit.TTL/3, time.Until(deadline))
		if d <= 0 {
			l.leave(req)
			return nil, &BackpressureError{RetryAfter: res.RetryAfter, MaxWait: l.maxWait, Result: res}
		}
		if err := sleepOrWake(ctx, d, wake); err != nil {
			l.leave(req)
			if errors.Is(err, context.DeadlineExceeded) {
				// ctx's deadline is the bound of the wait.
				return nil, &BackpressureError{RetryAfter: res.RetryAfter, MaxWait: l.maxWait, Result: res}
			}
			return nil, err
		}
	}
}

// sleepOrWake sleeps d, or until wake receives or ctx ends (its error).
func sleepOrWake(ctx context.Context, d time.Duration, wake <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// queued reports whether err is a denial that left the take waiting in a
// queue for a permit.
func queued(err error) bool {
	var bp *BackpressureError
	return errors.As(err, &bp) && bp.Result.InFlight.Queued
}

// leave takes req's permit id out of the queues it waits in, best effort.
func (l *Limiter) leave(req Request) {
	ctx, cancel := context.WithTimeout(context.Background(), refundTimeout)
	defer cancel()
	_, _ = l.store.Release(ctx, req.Buckets, req.Permit.ID)
}

// PermitStats is what a Limiter's in-flight permits are doing, in this
// process (see Limiter.PermitStats).
type PermitStats struct {
	// Held is how many permits the limiter's reservations hold now.
	Held int64
	// Waiting is how many Acquire (and WaitCosts) calls wait in a queue
	// for a permit now.
	Waiting int64
	// Lapsed counts the permits whose lease ended before a renewal
	// reached the store: a partition, a store down, a process paused
	// longer than two thirds of the lease.
	Lapsed int64
}

// permitCounts are a Limiter's PermitStats, counted as they change.
type permitCounts struct {
	held, waiting, lapsed atomic.Int64
}

// PermitStats returns what the limiter's in-flight permits are doing in
// this process, for metrics.
func (l *Limiter) PermitStats() PermitStats {
	return PermitStats{Held: l.permits.held.Load(), Waiting: l.permits.waiting.Load(), Lapsed: l.permits.lapsed.Load()}
}

// PermitTTL returns the lease of the in-flight permits the limiter takes
// (Config.PermitTTL, or DefaultPermitTTL).
func (l *Limiter) PermitTTL() time.Duration { return l.permitTTL }

// withPermit gives req a permit of its own, with the limiter's lease,
// when one of its buckets bounds in-flight takes and it takes tokens from
// that bucket, and it has none; and the limiter's lease to a permit
// without one.
func (l *Limiter) withPermit(req Request) Request {
	if req.Permit.ID != "" {
		if req.Permit.TTL == 0 {
			req.Permit.TTL = l.permitTTL
		}
		return req
	}
	for i, b := range req.Buckets {
		if b.InFlight > 0 && CostOf(req.N, req.Costs, i) > 0 {
			req.Permit = Permit{ID: newPermitID(), TTL: l.permitTTL}
			break
		}
	}
	return req
}

// newPermitID returns an id no other acquisition in the fleet has: 96
// random bits.
func newPermitID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// permit is what a Reservation knows of the in-flight permit it holds.
type permit struct {
	lease Permit
	// bounded is how many of the take's buckets bound in-flight takes:
	// a renewal that finds fewer held means a lease lapsed.
	bounded int
	mu      sync.Mutex
	timer   *time.Timer // the next renewal; nil once released or lapsed
	// until is when, on this process's clock (its monotonic reading), the
	// lease surely still holds: the start of the call that set it (the
	// take or the last renewal that found it held) plus the lease. The
	// store set the lease's end from its own clock after that start.
	until  atomic.Pointer[time.Time]
	lapsed atomic.Bool
	// released is set by the first Release (or Cancel).
	released atomic.Bool
}

// hold records the permit a granted req took, if any, and starts renewing
// it at a third of its lease.
func (r *Reservation) hold(req Request) {
	r.costs = req.Costs
	if req.Permit.ID == "" || !r.Result.Allowed {
		return
	}
	p := &permit{lease: req.Permit}
	for _, b := range req.Buckets {
		if b.InFlight > 0 {
			p.bounded++
		}
	}
	r.permit = p
	r.l.permits.held.Add(1)
	p.setUntil(r.asked.Add(p.lease.TTL))
	p.mu.Lock()
	p.timer = time.AfterFunc(p.lease.TTL/3, r.renew)
	p.mu.Unlock()
}

// renew extends the permit's lease, and schedules the next renewal; it
// stops once the permit is released or its lease has lapsed. A store that
// fails is tried again at the next renewal: the lease still has two
// thirds of its time.
func (r *Reservation) renew() {
	p := r.permit
	ctx, cancel := context.WithTimeout(context.Background(), p.lease.TTL/3)
	asked := time.Now()
	held, err := r.l.store.Renew(ctx, r.bs, p.lease)
	cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer == nil {
		return // released meanwhile
	}
	if err == nil && held < p.bounded {
		p.lapsed.Store(true)
		r.l.permits.lapsed.Add(1)
		p.timer = nil
		return
	}
	if err == nil {
		p.setUntil(asked.Add(p.lease.TTL))
	}
	p.timer = time.AfterFunc(p.lease.TTL/3, r.renew)
}

// setUntil records that the lease surely holds until t.
func (p *permit) setUntil(t time.Time) { p.until.Store(&t) }

// Held reports whether the reservation's permit surely still holds now:
// not released, not found lapsed, and within the lease counted from the
// start of the last call that found it held (the take or a renewal), on
// this process's clock. Check it right before acting on the permit (before
// sending a request): a process paused longer than its lease (SIGSTOP, a
// long GC stop) may have lost the permit to another holder meanwhile, and
// must acquire again. It is false for a reservation without a permit.
func (r *Reservation) Held() bool {
	if r == nil || r.permit == nil {
		return false
	}
	p := r.permit
	u := p.until.Load()
	return !p.released.Load() && !p.lapsed.Load() && u != nil && time.Now().Before(*u)
}

// Lapsed reports whether the reservation's permit was lost: its lease
// ended before a renewal reached the store (a partition, a store down
// longer than two thirds of the lease, a process paused that long), so
// the permit may be another holder's now.
func (r *Reservation) Lapsed() bool {
	return r != nil && r.permit != nil && r.permit.lapsed.Load()
}

// Release gives back the reservation's in-flight permit, at once, to the
// first waiter in the queue. Call it when the work ends, even when it
// failed: a permit not released comes back only when its lease ends,
// after the Limiter stops renewing it (the holder's process died). A
// permit whose lease has ended is released harmlessly. Releasing a
// reservation that holds no permit, or one released (or cancelled, or
// abandoned) already, is an error wrapping ErrInvalid that changes
// nothing.
func (r *Reservation) Release(ctx context.Context) error {
	if r == nil || r.permit == nil {
		return fmt.Errorf("%w: release: the reservation holds no in-flight permit (its take was denied, or none of its buckets bounds in-flight takes)", ErrInvalid)
	}
	if ctx == nil {
		return errNilContext
	}
	if !r.permit.released.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: release: permit %s was released already (or its reservation cancelled or abandoned)", ErrInvalid, r.permit.lease.ID)
	}
	return r.release(ctx)
}

// giveUp releases the reservation's permit, if it holds one not released
// yet, as Cancel does.
func (r *Reservation) giveUp(ctx context.Context) error {
	if r.permit == nil || !r.permit.released.CompareAndSwap(false, true) {
		return nil
	}
	if ctx == nil {
		r.permit.released.Store(false)
		return errNilContext
	}
	return r.release(ctx)
}

// release gives the permit back to the store; the caller has marked it
// released.
func (r *Reservation) release(ctx context.Context) error {
	p := r.permit
	r.l.permits.held.Add(-1)
	p.mu.Lock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
	if _, err := r.l.store.Release(ctx, r.bs, p.lease.ID); err != nil {
		return fmt.Errorf("release of permit %s: %w (it comes back when its lease ends, within %v)", p.lease.ID, err, p.lease.TTL)
	}
	return nil
}

// Abandon stops renewing the reservation's permit without releasing it:
// it lapses when its lease ends, PermitTTL after the last renewal, as a
// dead holder's does. It is for a holder that lost track of its work
// (an HTTP response body dropped unclosed, whose request may still be
// running upstream); a holder whose work ended calls Release. A Release
// after it does nothing. It does nothing for a reservation without a
// permit, or once released.
func (r *Reservation) Abandon() {
	if r == nil || r.permit == nil {
		return
	}
	p := r.permit
	if p.released.CompareAndSwap(false, true) {
		r.l.permits.held.Add(-1) // no longer this process's: it lapses
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
}

// NotifierOf returns the PermitNotifier of store, or of the store it
// wraps (a wrapper with an Unwrap() Store method, such as a failsafe or
// an instrumented store), or nil. A notice only wakes a waiter to take
// again through store, so reaching past a wrapper for it is safe.
func NotifierOf(store Store) PermitNotifier {
	for range 8 {
		if n, ok := store.(PermitNotifier); ok {
			return n
		}
		u, ok := store.(interface{ Unwrap() Store })
		if !ok {
			return nil
		}
		store = u.Unwrap()
	}
	return nil
}
