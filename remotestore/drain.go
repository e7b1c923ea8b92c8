package remotestore

import (
	"context"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/server/wire"
)

// DrainEach implements fleetrate.Store: one call of the raw store API,
// which the service applies in one atomic step.
func (s *Store) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	if err := fleetrate.ValidateDrains(drains); err != nil {
		return err
	}
	each := make([]wire.DrainItem, len(drains))
	for i, d := range drains {
		each[i] = wire.DrainItem{Bucket: wire.FromBuckets([]fleetrate.Bucket{d.Bucket})[0], DurationNS: int64(d.For), Void: d.Void}
	}
	return s.call(ctx, wire.DrainPath, wire.DrainRequest{Each: each}, &wire.OK{})
}
