package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/fleetrate/fleetrate"
)

// errNotYet is what this store answers for the parts of the store
// contract its scripts do not run yet: costs by bucket, settles and
// in-flight permits. It never takes a request it cannot run exactly.
var errNotYet = fmt.Errorf("%w: redisstore does not run costs by bucket, settles or in-flight permits yet: %w", fleetrate.ErrInvalid, errors.ErrUnsupported)

// unsupported reports whether req needs what the scripts do not run yet.
func unsupported(req fleetrate.Request) bool {
	if req.Costs != nil || req.Permit.ID != "" {
		return true
	}
	for _, b := range req.Buckets {
		if b.InFlight > 0 {
			return true
		}
	}
	return false
}

// Settle implements fleetrate.Store.
func (s *Store) Settle(context.Context, []fleetrate.Bucket, fleetrate.Settlement) error {
	return errNotYet
}

// Release implements fleetrate.Store.
func (s *Store) Release(context.Context, []fleetrate.Bucket, string) (int, error) {
	return 0, errNotYet
}

// Renew implements fleetrate.Store.
func (s *Store) Renew(context.Context, []fleetrate.Bucket, fleetrate.Permit) (int, error) {
	return 0, errNotYet
}
