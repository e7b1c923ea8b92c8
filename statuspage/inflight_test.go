package statuspage_test

import (
	"context"
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/statuspage"
	"github.com/fleetrate/fleetrate/transport"
)

// TestUpstreamRowsShowPermitsHeld: a row of an endpoint with an in-flight
// bound shows the permits held fleet-wide, and its credential's.
func TestUpstreamRowsShowPermitsHeld(t *testing.T) {
	ctx := context.Background()
	store := memstore.New(memstore.Options{})
	many := []fleetrate.Limit{fleetrate.PerSecond(100, 100)}
	up := transport.Upstream{Channel: "llm", Credential: many, CredentialInFlight: 5,
		Endpoints: []transport.Endpoint{{Name: "chat", Pattern: "/chat", Limits: many, InFlight: 3}}}
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r, err := lim.TryAcquire(ctx, transport.EndpointBucket("llm", "chat"), transport.CredentialBucket("llm"))
		if err != nil || !r.Result.Allowed {
			t.Fatalf("TryAcquire: %v", err)
		}
		defer func() { _ = r.Release(ctx) }()
	}
	rows, err := statuspage.TransportUpstreams(store, "", []transport.Upstream{up}, nil, transport.Adaptive{})(ctx)
	if err != nil || len(rows) != 1 {
		t.Fatalf("rows %v, %v", rows, err)
	}
	r := rows[0]
	if r.InFlight != 2 || r.InFlightBound != 3 || r.CredentialInFlight != 2 || r.CredentialInFlightBound != 5 {
		t.Errorf("in flight %d/%d, credential %d/%d; want 2/3, 2/5", r.InFlight, r.InFlightBound, r.CredentialInFlight, r.CredentialInFlightBound)
	}
}
