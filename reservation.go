package fleetrate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Reservation is a booking of tokens that the holder may use after Delay.
type Reservation struct {
	// Result is the store's decision; Result.Wait is the booked delay.
	Result Result
	l      *Limiter
	bs     []Bucket
	n      int64
	due    time.Time
	booked Booking
	// done is set once Cancel has given the booking back (or is doing
	// so): Cancel is safe to call from several goroutines, such as Sleep's
	// when its context ends and the holder's own.
	done atomic.Bool
	// costs are the take's costs by bucket (nil: n from each); settled is
	// set once Settle has applied.
	costs   []int64
	settled atomic.Bool
	// permit is the in-flight permit the reservation holds, if any;
	// asked is when the take that granted it was sent.
	permit *permit
	asked  time.Time
}

// Delay returns how long from now the holder must wait before acting.
func (r *Reservation) Delay() time.Duration {
	return max(time.Until(r.due), 0)
}

// Due returns when, on this process's clock, the booked slot begins: the
// store's decision plus the booked wait, placed by the limiter's clock
// anchor (never before the slot).
func (r *Reservation) Due() time.Time { return r.due }

// Booking returns where the take left each limit of each bucket: the
// store's clock and every debt, in bucket order (see Request.Booking).
func (r *Reservation) Booking() Booking { return r.booked }

// Cancel gives the booked tokens back, as x/time/rate's Cancel does for a
// reservation whose time to act has not come: each limit of each bucket
// gets them back only when nothing was booked on it after this
// reservation, because a later booking's slot was computed from them and
// giving them back would grant that slot twice. So cancelling the latest
// reservation frees its tokens; cancelling one with later reservations
// behind it leaves them booked (they are used by no one, and the bucket's
// bound holds). It differs from x/time/rate in two ways: a limit gets all
// n tokens back or none (x/time/rate restores the part later reservations
// did not count against), and once the slot has begun nothing goes back,
// on the store's clock, as x/time/rate restores nothing after its time to
// act: the holder may have acted. Call it when the reservation will not
// be used, before its slot (Sleep does, when its context ends); for a
// grant taken at once and not used, use Limiter.Refund. It releases the
// reservation's in-flight permit, if any (see Release). A second call
// does nothing, and calls from several goroutines are safe.
func (r *Reservation) Cancel(ctx context.Context) error {
	if r == nil {
		return nil
	}
	rerr := r.giveUp(ctx)
	if (r.n == 0 && r.costs == nil) || len(r.booked.Debts) == 0 || !r.done.CompareAndSwap(false, true) {
		return rerr
	}
	err := errors.Join(r.l.store.Cancel(ctx, r.bs, r.n, r.booked), rerr)
	if err != nil {
		r.done.Store(false) // not given back: a later call may try again
	}
	return err
}

// giveBack cancels the reservation, best effort, even once ctx has ended.
func (r *Reservation) giveBack(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
	defer cancel()
	_ = r.Cancel(rctx)
}

// Sleep blocks until the booked slot begins. A slot that begins after
// ctx's deadline is given back at once and fails with a
// *BackpressureError; if ctx ends during the sleep the booking is given
// back (see Cancel) and ctx's error is returned.
func (r *Reservation) Sleep(ctx context.Context) error {
	if r == nil {
		return fmt.Errorf("%w: reservation is nil", ErrInvalid)
	}
	if dl, ok := ctx.Deadline(); ok && r.due.After(dl) {
		// The max wait counted from the request, the slot from the
		// store's decision, which came later: on this process's clock the
		// slot begins after the deadline, so the wait cannot be honoured.
		r.giveBack(ctx)
		return &BackpressureError{RetryAfter: r.Result.Wait, MaxWait: max(time.Until(dl), 0), Result: r.Result}
	}
	d := time.Until(r.due)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		r.giveBack(ctx)
		return ctx.Err()
	}
}

// Reserve books one token from the named bucket. See ReserveN.
func (l *Limiter) Reserve(ctx context.Context, name string) (*Reservation, error) {
	return l.ReserveN(ctx, 1, name)
}

// ReserveN books n tokens from every named bucket, now or up to the max
// wait in the future (or the horizon of ctx's priority class, when
// shorter: see WithPriority), in one round trip. When the wait would be longer,
// nothing is booked and the error is a *BackpressureError. n larger than a
// burst fails at once with ErrBurstExceeded.
func (l *Limiter) ReserveN(ctx context.Context, n int64, names ...string) (*Reservation, error) {
	return l.reserve(ctx, n, l.maxWait, names)
}

// reserve is ReserveN with a max wait.
func (l *Limiter) reserve(ctx context.Context, n int64, maxWait time.Duration, names []string) (*Reservation, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	bs, err := l.buckets(names)
	if err != nil {
		return nil, err
	}
	defer l.release(bs)
	return l.book(ctx, Request{Buckets: slices.Clone(*bs), N: n, MaxWait: maxWait})
}

// Book books req, a store request built by the caller, as ReserveN books
// named buckets: with the limiter's clock anchor (Reservation.Due), ctx's
// priority class applied to every bucket (its reserve set, the max wait
// cut to its horizon) and cancels that give back only what no later
// booking relies on. It is for callers that take buckets with limits of
// their own beside the limiter's, such as transport's adapted rates and
// pause markers: take buckets from Limiter.Bucket and change their limits,
// or add buckets under a key no configured bucket uses. req.MaxWait is
// the longest wait to book (0: only now), at most the limiter's max wait;
// req.Booking is ignored (see Reservation.Booking).
//
// A take of tokens from a bucket that bounds in-flight takes
// (Bucket.InFlight) takes a permit with them: req.Permit, or one of its
// own when its ID is empty (a zero TTL is the limiter's PermitTTL). With
// req.MaxWait above 0 and no permit free, Book waits in the buckets'
// queue as Acquire does, within the limiter's max wait and ctx's
// deadline, each take booking at most req.MaxWait ahead. The Reservation
// holds the permit, renewed, until Release (or Cancel); Settle adjusts
// req.Costs to the real costs.
func (l *Limiter) Book(ctx context.Context, req Request) (*Reservation, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	if req.MaxWait > l.maxWait {
		return nil, fmt.Errorf("%w: max wait %v exceeds the limiter's max wait %v", ErrInvalid, req.MaxWait, l.maxWait)
	}
	req.Buckets = slices.Clone(req.Buckets)
	req = l.withPermit(req)
	if req.Permit.ID != "" && req.MaxWait > 0 {
		return l.queue(ctx, req, req.MaxWait)
	}
	r, err := l.book(ctx, req)
	if err != nil {
		return nil, err
	}
	r.hold(req)
	return r, nil
}

// book takes req's buckets, which the reservation keeps, under ctx's
// priority class.
func (l *Limiter) book(ctx context.Context, req Request) (*Reservation, error) {
	if l.store == nil {
		return nil, errZeroLimiter
	}
	var err error
	if req.MaxWait, err = l.classify(ctx, req.Buckets, req.MaxWait); err != nil {
		return nil, err
	}
	r := &Reservation{l: l, n: req.N}
	req.Booking = &r.booked
	start := time.Now()
	res, err := l.store.Take(ctx, req)
	// The wait counts from the store's decision, which happened between
	// start and the answer: the anchor places it (see anchor).
	answered := time.Now()
	res.Limit.strip()
	if err != nil {
		return nil, err
	}
	if !res.Allowed {
		return nil, &BackpressureError{RetryAfter: res.RetryAfter, MaxWait: req.MaxWait, Result: res}
	}
	r.Result, r.bs, r.due, r.asked = res, req.Buckets, l.clock.due(start, answered, res), start
	return r, nil
}

// Wait blocks until one token of the named bucket is granted, and returns
// the store's decision. See WaitN.
func (l *Limiter) Wait(ctx context.Context, name string) (Result, error) {
	return l.WaitN(ctx, 1, name)
}

// WaitN reserves n tokens from every named bucket with a max wait of the
// smallest of the configured max wait, ctx's deadline and the horizon of
// ctx's priority class (see WithPriority), then sleeps
// exactly the booked delay. Waiters are served in booking (FIFO) order and
// never poll. A wait that would exceed the bound fails at once with a
// *BackpressureError; so does a slot that, placed on this process's clock,
// would begin after ctx's deadline (the booking is then given back at
// once). If ctx ends during the sleep the booking is cancelled (see
// Reservation.Cancel) and ctx's error is returned. The longest WaitN
// blocks is the max wait, or less when ctx's deadline is sooner, plus the
// store's round trips.
func (l *Limiter) WaitN(ctx context.Context, n int64, names ...string) (Result, error) {
	if ctx == nil {
		return Result{}, errNilContext
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	maxWait := l.maxWait
	if dl, ok := ctx.Deadline(); ok {
		maxWait = max(min(maxWait, time.Until(dl)), 0)
	}
	r, err := l.reserve(ctx, n, maxWait, names)
	if err != nil {
		return Result{}, err
	}
	if err := r.Sleep(ctx); err != nil {
		return Result{}, err
	}
	return r.Result, nil
}
