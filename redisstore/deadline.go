package redisstore

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/fleetrate/fleetrate"
)

// bounded runs f within ctx's deadline, whatever the client's own
// settings: when the client would not give up in time, f runs on a runner
// that is abandoned at the deadline (and runs no other call until f
// returns).
func (s *Store) bounded(ctx context.Context, f func(context.Context) error) error {
	if s.direct {
		return f(ctx)
	}
	done := make(chan error, 1)
	s.runners.start(func() { done <- f(ctx) })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cancelAbandoned gives back the bookings of shared calls' takes whose
// callers gave up after the store had granted them, latest first, so that
// each cancel finds its booking the latest and gets its tokens back (see
// gcra.Cancel): best effort, bounded by a second.
func (s *Store) cancelAbandoned(calls []*batchCall) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i := len(calls) - 1; i >= 0; i-- {
		c := calls[i]
		// Its caller never saw the grant, so never acted on it: given
		// back whether or not its slot has begun.
		_ = s.cancel(ctx, c.req.Buckets, c.req.N, c.booking, math.MaxInt64)
	}
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout < 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.timeout)
}

// unavailable wraps a Redis failure so that callers see ErrStoreUnavailable.
// failed reports err, the failure of a call made for a caller whose
// context is caller: when the caller's context ended (cancelled, or its
// own deadline passed) the error is the context's, not the store's, so
// that errors.Is(err, context.Canceled) holds and failure policies do not
// count the caller's choice as an outage.
func failed(caller context.Context, op string, err error) error {
	if cerr := ended(caller); cerr != nil {
		return fmt.Errorf("redisstore: %s: %w", op, cerr)
	}
	return unavailable(op, err)
}

// ended returns ctx's error, or context.DeadlineExceeded once its deadline
// has passed even if ctx does not say so yet: a call bounded by that
// deadline has a timer of its own (see boundCall), which may fire, and
// fail the call, before the context's does.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

func unavailable(op string, err error) error {
	return fmt.Errorf("%w: redis %s: %w", fleetrate.ErrStoreUnavailable, op, err)
}
