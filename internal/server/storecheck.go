package server

import (
	"context"
	"errors"
	"time"

	"github.com/fleetrate/fleetrate"
)

// StoreCheckInterval is how often the server probes its store in the
// background (see Options.HealthChecksStore).
const StoreCheckInterval = time.Second

// checkStore probes the store every StoreCheckInterval until ctx ends:
// it logs when the store stops and starts answering (a Redis outage was
// visible only in metrics and /readyz), and with HealthChecksStore it
// sets the health service's status from it.
func (s *Server) checkStore(ctx context.Context) {
	every(ctx, StoreCheckInterval, func() bool {
		err := s.ready(ctx)
		if s.draining.Load() || ctx.Err() != nil {
			return false
		}
		down := err != nil
		if s.storeDown.Swap(down) == down {
			return true
		}
		if s.opts.HealthChecksStore {
			s.refreshHealth()
		}
		if down {
			s.log.Error("store unavailable", "store", s.opts.StoreName, "error", err.Error(), "health_reports_it", s.opts.HealthChecksStore)
		} else {
			s.log.Info("store available again", "store", s.opts.StoreName)
		}
		return true
	})
}

// ready reports whether the store answers a peek of the probe bucket.
func (s *Server) ready(ctx context.Context) error {
	if s.draining.Load() {
		return errors.New("shutting down")
	}
	ctx, cancel := s.storeCtx(ctx)
	defer cancel()
	res, err := s.store.Take(ctx, fleetrate.Request{
		Buckets: []fleetrate.Bucket{{Prefix: s.opts.Prefix, Key: ProbeKey, Limits: []fleetrate.Limit{{Name: "probe", Rate: 1, Burst: 1}}}},
	})
	return degradedErr(res, err)
}
