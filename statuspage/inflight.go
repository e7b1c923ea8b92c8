package statuspage

import (
	"context"
	"fmt"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport"
)

// inFlightOf fills row's in-flight counts of endpoint e of upstream u, and
// of its credential, with a peek of each bucket under prefix that bounds
// requests in flight: the permits held fleet-wide.
func inFlightOf(ctx context.Context, store fleetrate.Store, prefix string, u transport.Upstream, e transport.Endpoint, row *Upstream) error {
	if e.InFlight > 0 {
		b := fleetrate.Bucket{Prefix: prefix, Key: transport.EndpointBucket(u.Channel, e.Name), Limits: e.Limits, InFlight: e.InFlight}
		held, err := permitsHeld(ctx, store, b)
		if err != nil {
			return err
		}
		row.InFlight, row.InFlightBound = held, e.InFlight
	}
	if u.CredentialInFlight > 0 {
		b := fleetrate.Bucket{Prefix: prefix, Key: transport.CredentialBucket(u.Channel), Limits: u.Credential, InFlight: u.CredentialInFlight}
		held, err := permitsHeld(ctx, store, b)
		if err != nil {
			return err
		}
		row.CredentialInFlight, row.CredentialInFlightBound = held, u.CredentialInFlight
	}
	return nil
}

// permitsHeld peeks bucket b: how many in-flight permits it holds.
func permitsHeld(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, peekTimeout)
	defer cancel()
	res, err := store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}})
	if err != nil {
		return 0, fmt.Errorf("peeking the permits of %s: %w", b.Key, err)
	}
	return res.InFlight.Held, nil
}
