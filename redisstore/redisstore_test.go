package redisstore_test

import (
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/storetest"
)

func newStore(t *testing.T, srv *redistest.Server) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(srv.Client(), redisstore.Options{Timeout: 2e9})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, srv)
	storetest.Run(t, func(*testing.T) fleetrate.Store { return s })
}
