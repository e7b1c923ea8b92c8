package fleetrate

import (
	"context"
	"errors"
	"fmt"
)

// Cost is what one take costs one named bucket: "1 request" from a
// requests-per-minute bucket and "1,200 tokens" from a tokens-per-minute
// bucket of the same credential are two Costs of one take.
type Cost struct {
	// Bucket is the bucket's name, as for Allow.
	Bucket string
	// N is the cost in tokens, between 0 and the bucket's burst.
	N int64
}

// AllowCosts takes costs from their buckets now, all or nothing, as
// AllowN does with one n for every bucket. A denial is a Reservation whose
// Result.Allowed is false and that holds nothing; an error means the store
// failed or an argument is invalid. A bucket with an in-flight bound
// (BucketConfig.InFlight) takes a permit too, if one is free now: the
// Reservation holds it until Release. Settle the grant once its work is
// done and its real cost known.
func (l *Limiter) AllowCosts(ctx context.Context, costs ...Cost) (*Reservation, error) {
	req, err := l.costRequest(ctx, costs)
	if err != nil {
		return nil, err
	}
	r, err := l.book(ctx, req)
	var bp *BackpressureError
	if errors.As(err, &bp) {
		return &Reservation{Result: bp.Result, l: l}, nil
	}
	if err != nil {
		return nil, err
	}
	r.hold(req)
	return r, nil
}

// ReserveCosts books costs from their buckets, now or up to the max wait
// in the future, as ReserveN does with one n for every bucket; a longer
// wait fails with a *BackpressureError. A bucket with an in-flight bound
// takes a permit too, if one is free now (else a *BackpressureError):
// WaitCosts and Acquire wait for one.
func (l *Limiter) ReserveCosts(ctx context.Context, costs ...Cost) (*Reservation, error) {
	req, err := l.costRequest(ctx, costs)
	if err != nil {
		return nil, err
	}
	req.MaxWait = l.maxWait
	r, err := l.book(ctx, req)
	if queued(err) {
		// Reserve never waits for a permit: leave the queue the take
		// joined.
		l.leave(req)
	}
	if err != nil {
		return nil, err
	}
	r.hold(req)
	return r, nil
}

// WaitCosts takes costs from their buckets as WaitN takes n from each:
// it books them within the max wait (and ctx's deadline) and sleeps until
// the slot. A bucket with an in-flight bound takes a permit too, waiting
// for one first come first served, within the same bound: see Acquire.
// It returns the Reservation, to Settle once the work's real cost is
// known and to Release when the bucket bounds in-flight takes.
func (l *Limiter) WaitCosts(ctx context.Context, costs ...Cost) (*Reservation, error) {
	req, err := l.costRequest(ctx, costs)
	if err != nil {
		return nil, err
	}
	return l.wait(ctx, req)
}

// costRequest builds the store request of a take of costs, with a permit
// when a bucket bounds in-flight takes.
func (l *Limiter) costRequest(ctx context.Context, costs []Cost) (Request, error) {
	if ctx == nil {
		return Request{}, errNilContext
	}
	if l.store == nil {
		return Request{}, errZeroLimiter
	}
	if len(costs) == 0 {
		return Request{}, fmt.Errorf("%w: at least one cost is required", ErrInvalid)
	}
	req := Request{Buckets: make([]Bucket, len(costs)), Costs: make([]int64, len(costs))}
	for i, c := range costs {
		b, err := l.bucket(c.Bucket)
		if err != nil {
			return Request{}, err
		}
		if c.N < 0 {
			return Request{}, fmt.Errorf("%w: cost of bucket %q must be >= 0, got %d", ErrInvalid, c.Bucket, c.N)
		}
		req.Buckets[i], req.Costs[i] = b, c.N
		if b.InFlight > 0 && req.Permit.ID == "" {
			req.Permit = Permit{ID: newPermitID(), TTL: l.permitTTL}
		}
	}
	return req, nil
}

// Settle adjusts the grant to what its work really cost, by bucket name:
// a bucket charged less gets the difference back as far as no take
// decided after the grant relies on it (see Store.Settle), one charged
// more owes the difference at once, which pushes later takes back and is
// never refused. Buckets not named keep the cost they were charged. The
// bound this keeps: in every window between two grants' slots, the real
// costs of its grants stay within burst + rate × window plus the
// under-estimates of those not yet settled when the last of them was
// decided (docs/ARCHITECTURE.md, "Settling"). An estimate at the mean
// cost is fine: on a busy bucket what an answer cost less goes back up to
// the least lead of the later takes. A settle is applied once: a second
// call, or one on a denial or a cancelled reservation, fails with
// ErrInvalid and changes nothing.
func (r *Reservation) Settle(ctx context.Context, actual ...Cost) error {
	if r == nil || r.l == nil || !r.Result.Allowed {
		return fmt.Errorf("%w: settle: the reservation granted nothing", ErrInvalid)
	}
	if ctx == nil {
		return errNilContext
	}
	st := Settlement{Costs: make([]int64, len(r.bs)), Actual: make([]int64, len(r.bs)), At: r.Result.At.Add(r.Result.Wait)}
	for i := range r.bs {
		st.Costs[i] = CostOf(r.n, r.costs, i)
		st.Actual[i] = st.Costs[i]
	}
	for _, c := range actual {
		i := r.index(c.Bucket)
		if i < 0 {
			return fmt.Errorf("%w: settle: bucket %q is not one the reservation took from", ErrInvalid, c.Bucket)
		}
		st.Actual[i] = c.N
	}
	if r.done.Load() {
		return fmt.Errorf("%w: settle: the reservation was cancelled", ErrInvalid)
	}
	if !r.settled.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: settle: the reservation was settled already (a settle applies once)", ErrInvalid)
	}
	bs := make([]Bucket, len(r.bs))
	copy(bs, r.bs)
	r.l.lowestReserves(bs)
	if err := r.l.store.Settle(ctx, bs, st); err != nil {
		r.settled.Store(false) // not applied: a later call may try again
		return err
	}
	return nil
}

// index returns the position of the bucket named name in the
// reservation's take, or -1.
func (r *Reservation) index(name string) int {
	for i, b := range r.bs {
		if b.Key == name {
			return i
		}
	}
	return -1
}

// lowestReserves sets each bucket's Reserve to that of its lowest class,
// for a refund or a settle: its bookings lie ahead while the bucket holds
// less than that (see Store.Refund).
func (l *Limiter) lowestReserves(bs []Bucket) {
	for i := range bs {
		for _, p := range l.classesOf(bs[i].Key) {
			bs[i].Reserve = max(bs[i].Reserve, p.Reserve)
		}
	}
}
