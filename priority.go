package fleetrate

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
)

// Priority is a class of takes below the top one on a shared bucket, such
// as a bulk job that must never starve the requests that matter. A take
// of the class conforms only when every limit of the bucket still holds
// Reserve tokens after it, and it books at most Horizon ahead. Takes with
// no class (or a class another bucket of the Limiter configures, but not
// this one) are the top class: they may take the reserve, and book up to
// the Limiter's max wait. A class no bucket of the Limiter configures is
// an error wrapping ErrInvalid that names it: a typo, not the top class.
//
// The bound: once a lower class has saturated the bucket, a take of n <=
// Reserve tokens by the class above waits at most Horizon - (Reserve-n)
// token intervals (never, when Horizon is below that), plus what other
// takes of its own class booked ahead of it. Every take still books as an
// ordinary token-bucket take, so the bucket grants no more than its
// limits over all classes together, and the lower class uses whatever the
// higher one leaves. When the higher class itself takes all the rate, the
// lower class gets nothing (backpressure) until it leaves some: classes
// are strict, not shares.
type Priority struct {
	// Name identifies the class, as given to WithPriority. It must not be
	// empty.
	Name string
	// Reserve is how many tokens every limit of the bucket keeps for the
	// classes above, after a take of this class. It must be below every
	// limit's burst; a take of more than burst-Reserve tokens fails with
	// ErrBurstExceeded. Size it as the burst the higher class needs
	// without waiting.
	Reserve int64
	// Horizon is how far ahead a take of this class may book (its max
	// wait, when shorter than the Limiter's or the context's). It bounds
	// how long a higher class waits behind this one. 0 books nothing
	// ahead: a Wait of this class then fails at once with a
	// *BackpressureError when the bucket holds nothing beyond the reserve.
	// At most MaxWaitCap.
	Horizon time.Duration
	// InFlightReserve is, for a bucket that bounds takes in flight
	// (BucketConfig.InFlight), how many of its permits a take of this
	// class leaves free for the classes above (Bucket.PermitReserve): it
	// is admitted while the permits held, the waiters of its class or
	// above ahead of it, and this reserve stay below the bound, and a
	// waiter of this class never holds back a take of a class above it.
	// It must be below the bound of every bucket that configures the
	// class and bounds takes in flight; buckets without a bound ignore it.
	// 0 keeps none.
	InFlightReserve int64
}

type priorityKey struct{}

// WithPriority returns a context whose takes (Allow, Reserve, Wait and
// their N forms, and Peek) are of the named priority class, as configured
// in Config.Priorities or BucketConfig.Priorities. A bucket that does not
// configure the class serves the take as top class; a name no bucket of
// the Limiter configures is an error wrapping ErrInvalid. An empty name
// is the top class.
func WithPriority(ctx context.Context, class string) context.Context {
	if class != "" {
		priorityUsed.Store(true)
	}
	return context.WithValue(ctx, priorityKey{}, class)
}

// priorityUsed records that WithPriority named a class: until then, a
// Limiter that configures no class skips looking for one in the context
// of every take (a context's Value walks its whole chain).
var priorityUsed atomic.Bool

// PriorityFrom returns the priority class set on ctx by WithPriority, or
// "" (the top class).
func PriorityFrom(ctx context.Context) string {
	p, _ := ctx.Value(priorityKey{}).(string)
	return p
}

// validatePriorities checks the classes of field that apply to buckets
// with the given limits (none: checked where they apply).
func validatePriorities(field string, ps []Priority, limits []Limit, inFlight int64) error {
	for i, p := range ps {
		switch {
		case p.Name == "":
			return fmt.Errorf("%s[%d].name: must not be empty", field, i)
		case p.Reserve < 0:
			return fmt.Errorf("%s[%d] %q reserve: must be at least 0, got %d", field, i, p.Name, p.Reserve)
		case p.InFlightReserve < 0 || inFlight > 0 && p.InFlightReserve >= inFlight:
			return fmt.Errorf("%s[%d] %q in_flight_reserve: must be between 0 and the bucket's in_flight - 1 (%d), got %d", field, i, p.Name, max(inFlight-1, 0), p.InFlightReserve)
		case p.Horizon < 0 || p.Horizon > MaxWaitCap:
			return fmt.Errorf("%s[%d] %q horizon: must be between 0 and %v, got %v", field, i, p.Name, MaxWaitCap, p.Horizon)
		}
		for _, q := range ps[:i] {
			if q.Name == p.Name {
				return fmt.Errorf("%s[%d].name: duplicate %q", field, i, p.Name)
			}
		}
		for j, l := range limits {
			if p.Reserve >= l.Burst {
				return fmt.Errorf("%s[%d] %q reserve: must be below the burst of every limit, got %d for limits[%d] burst %d", field, i, p.Name, p.Reserve, j, l.Burst)
			}
		}
	}
	return nil
}

// findPriority returns the class named name in ps.
func findPriority(ps []Priority, name string) (Priority, bool) {
	for _, p := range ps {
		if p.Name == name {
			return p, true
		}
	}
	return Priority{}, false
}

// classify applies ctx's priority class to the buckets of a take: each
// bucket that configures the class keeps its reserve, and the max wait is
// cut to the class's shortest horizon among them. It returns the max wait
// to use.
func (l *Limiter) classify(ctx context.Context, bs []Bucket, maxWait time.Duration) (time.Duration, error) {
	if !l.prioritized {
		if priorityUsed.Load() {
			if class := PriorityFrom(ctx); class != "" {
				return 0, fmt.Errorf("%w: priority %q: this limiter configures no priority classes", ErrInvalid, class)
			}
		}
		return maxWait, nil
	}
	class := PriorityFrom(ctx)
	if class == "" {
		return maxWait, nil
	}
	if !l.classNames[class] {
		return 0, fmt.Errorf("%w: priority %q: no bucket of this limiter configures it", ErrInvalid, class)
	}
	for i := range bs {
		p, ok := findPriority(l.classesOf(bs[i].Key), class)
		if !ok {
			continue
		}
		bs[i].Reserve = p.Reserve
		if bs[i].InFlight > 0 {
			bs[i].PermitReserve = p.InFlightReserve
		}
		maxWait = min(maxWait, p.Horizon)
	}
	return maxWait, nil
}

// classesOf returns the priority classes of the named bucket.
func (l *Limiter) classesOf(name string) []Priority {
	if nb, ok := l.named[name]; ok {
		return nb.classes
	}
	return l.classes
}
