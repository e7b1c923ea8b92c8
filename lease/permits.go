package lease

import (
	"context"

	"github.com/fleetrate/fleetrate"
)

// Settle implements fleetrate.Store. It ends the leases of the buckets,
// whose tokens a settle changes, and settles in the inner store. A take
// served from a lease reports its lease's Result.At, so its settle names
// the lease's take in the inner store, whose later takes' leads bound
// what goes back.
func (s *Store) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	for _, b := range buckets {
		s.forget(b.StoreKey())
	}
	return s.inner.Settle(ctx, buckets, st)
}

// Release implements fleetrate.Store: permits are never leased locally.
func (s *Store) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	return s.inner.Release(ctx, buckets, id)
}

// Renew implements fleetrate.Store: permits are never leased locally.
func (s *Store) Renew(ctx context.Context, buckets []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	return s.inner.Renew(ctx, buckets, p)
}

// DrainEach implements fleetrate.Store. It also ends the leases of the
// buckets, whose tokens a drain takes back.
func (s *Store) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	for _, d := range drains {
		s.forget(d.Bucket.StoreKey())
	}
	return s.inner.DrainEach(ctx, drains)
}
