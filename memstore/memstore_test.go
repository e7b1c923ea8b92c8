package memstore_test

import (
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(*testing.T) fleetrate.Store { return memstore.New(memstore.Options{}) })
}
