package failsafe

import (
	"context"

	"github.com/fleetrate/fleetrate"
)

// Settle implements fleetrate.Store. Under LocalFallback a failed settle
// goes to the local bucket, which then owes (or gets back) the
// difference; otherwise the store's error is returned.
func (s *Store) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	ok, err := s.call(ctx, func() error { return s.primary.Settle(ctx, buckets, st) })
	if ok || s.opts.Policy != LocalFallback {
		return err
	}
	return s.fallback.Settle(ctx, s.localBuckets(buckets), st)
}

// Release implements fleetrate.Store. A permit may have come from the
// primary store or, under LocalFallback while it failed, from the local
// one: it is released from both, so neither keeps it until its lease ends.
func (s *Store) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	var held int
	_, err := s.call(ctx, func() (err error) {
		held, err = s.primary.Release(ctx, buckets, id)
		return err
	})
	if s.fallback != nil {
		if h, ferr := s.fallback.Release(ctx, s.localBuckets(buckets), id); ferr == nil && h > 0 {
			return h, nil
		}
	}
	return held, err
}

// Renew implements fleetrate.Store. Under LocalFallback a permit the
// local store granted is renewed there; otherwise the primary's answer
// (or error) is returned.
func (s *Store) Renew(ctx context.Context, buckets []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	var held int
	ok, err := s.call(ctx, func() (err error) {
		held, err = s.primary.Renew(ctx, buckets, p)
		return err
	})
	if s.fallback != nil && (!ok || held == 0) {
		if h, ferr := s.fallback.Renew(ctx, s.localBuckets(buckets), p); ferr == nil && h > 0 {
			return h, nil
		}
	}
	return held, err
}

// DrainEach implements fleetrate.Store. Under LocalFallback a failed drain
// drains the local buckets; otherwise the store's error is returned.
func (s *Store) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	ok, err := s.call(ctx, func() error { return s.primary.DrainEach(ctx, drains) })
	if ok || s.opts.Policy != LocalFallback {
		return err
	}
	local := make([]fleetrate.Drain, len(drains))
	for i, d := range drains {
		local[i] = d
		local[i].Bucket = s.localBuckets([]fleetrate.Bucket{d.Bucket})[0]
	}
	return s.fallback.DrainEach(ctx, local)
}
