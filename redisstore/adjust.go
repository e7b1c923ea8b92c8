package redisstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
)

// Refund implements fleetrate.Store.
func (s *Store) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	if err := fleetrate.ValidateRefund(buckets, n, at); err != nil {
		return err
	}
	return s.run(ctx, "refund", refundScript, buckets, appendTakeLimits([]any{n, at.UnixMicro()}, buckets))
}

// Cancel implements fleetrate.Store.
func (s *Store) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	if err := fleetrate.ValidateCancel(buckets, n, b); err != nil {
		return err
	}
	return s.cancel(ctx, buckets, n, b, gcra.BookedWait(buckets, b.Debts))
}

// cancel is Cancel of a booking whose slot began wait ns after its stamp:
// after that, nothing goes back. Each bucket gets back its own cost
// (b.Costs, or n).
func (s *Store) cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking, wait int64) error {
	args := make([]any, 2, 2+len(buckets)*4+len(b.Debts)*3)
	args[0], args[1] = b.Stamp, wait
	off := 0
	for i := range buckets {
		args = appendLimits(args, buckets[i:i+1])
		args = append(args, fleetrate.CostOf(n, b.Costs, i))
		for _, d := range b.Debts[off : off+len(buckets[i].Limits)] {
			args = append(args, d)
		}
		off += len(buckets[i].Limits)
	}
	return s.run(ctx, "cancel", cancelScript, buckets, args)
}

// Drain implements fleetrate.Store.
func (s *Store) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	if d < 0 || d > fleetrate.MaxWaitCap {
		return fmt.Errorf("%w: drain duration must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, d)
	}
	if err := fleetrate.ValidateBuckets(buckets); err != nil {
		return err
	}
	drains := make([]fleetrate.Drain, len(buckets))
	for i, b := range buckets {
		drains[i] = fleetrate.Drain{Bucket: b, For: d}
	}
	return s.drain(ctx, drains)
}

// DrainEach implements fleetrate.Store: one script call drains every
// bucket for its own duration.
func (s *Store) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	if err := fleetrate.ValidateDrains(drains); err != nil {
		return err
	}
	return s.drain(ctx, drains)
}

// drain runs the drain script for validated drains.
func (s *Store) drain(ctx context.Context, drains []fleetrate.Drain) error {
	buckets := make([]fleetrate.Bucket, len(drains))
	args := make([]any, 0, 4*len(drains))
	for i, d := range drains {
		buckets[i] = d.Bucket
		void := 0
		if d.Void {
			void = 1
		}
		args = appendLimits(append(args, int64(d.For), void), buckets[i:i+1])
	}
	return s.run(ctx, "drain", drainScript, buckets, args)
}

// run runs a script that changes buckets (already validated), with args
// as its ARGV, and returns nothing the client needs, within the store's
// timeout. The buckets must share a hash slot.
func (s *Store) run(ctx context.Context, op string, script *redis.Script, buckets []fleetrate.Bucket, args []any) error {
	keys := storeKeys(buckets)
	if err := s.sameSlot(keys); err != nil {
		return err
	}
	sctx, cancel := s.ctx(ctx)
	defer cancel()
	err := s.bounded(sctx, func(ctx context.Context) error {
		return s.eval(ctx, script, keys, args...).Err()
	})
	if err != nil {
		return s.explain(failed(ctx, op, err))
	}
	return nil
}

// Reset implements fleetrate.Store. Each key is deleted on its own, with
// its permit keys (see permitKeys), so that keys on different Cluster
// slots work.
func (s *Store) Reset(ctx context.Context, keys ...string) error {
	sctx, cancel := s.ctx(ctx)
	defer cancel()
	err := s.bounded(sctx, func(ctx context.Context) error {
		for _, k := range keys {
			del := []string{k}
			if h, q, w, err := s.permitKeys(k); err == nil {
				// A key refused permit keys never had any, nor quotas.
				del = append(del, h, q, w, strings.TrimSuffix(h, heldSuffix)+quotaSuffix)
			}
			if err := s.c.Del(ctx, del...).Err(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.explain(failed(ctx, "reset", err))
	}
	return nil
}
