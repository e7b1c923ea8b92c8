package lease_test

import (
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/storetest"
)

// TestConformanceWhileRefused runs the store conformance suite through a
// lease store whose leases every bucket refuses (Tokens above any burst):
// takes then go to the shared store one by one, and the lease store must
// be exactly the store it wraps. Leased takes are not exact by design;
// TestWindowBound checks their stated bound.
func TestConformanceWhileRefused(t *testing.T) {
	storetest.Run(t, func(t *testing.T) fleetrate.Store {
		s, err := lease.New(memstore.New(memstore.Options{}), lease.Options{Tokens: 1 << 62})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
