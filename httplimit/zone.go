package httplimit

import (
	"fmt"
	"net/http"
	"sync"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
)

// MaxQuotaZones is the most time zones the quotas of one policy (or tier)
// follow at once with Policy.QuotaZone: the tz database has about 600.
const MaxQuotaZones = 1024

// zones keeps a policy's limiters by the time zone its quotas follow, for
// Policy.QuotaZone: the same bucket (the same key, limits and in-flight
// bound), and the quotas without a Location placed in the zone. A quota's
// use is kept by its period, zone included (fleetrate.Quota.Key), so each
// zone's day is counted apart and a client that moves zone starts a fresh
// window.
type zones struct {
	zone func(*http.Request) (string, error)
	cfg  fleetrate.Config // the policy's, quotas as configured

	mu   sync.Mutex
	lims map[string]*fleetrate.Limiter
}

// limiter returns the limiter that serves r: the policy's own, or with
// QuotaZone the one of the client's zone. An error is the zone function's
// or about the zone it named.
func (p *policy) limiter(r *http.Request) (*fleetrate.Limiter, error) {
	z := p.zones
	if z == nil {
		return p.lim, nil
	}
	name, err := z.zone(r)
	if err != nil {
		return nil, fmt.Errorf("the client's time zone: %w", err)
	}
	if name == "" {
		return p.lim, nil
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if lim, ok := z.lims[name]; ok {
		return lim, nil
	}
	if len(z.lims) >= MaxQuotaZones {
		return nil, fmt.Errorf("the client's time zone %q: policy %q already follows %d zones, the most it may", name, p.name, MaxQuotaZones)
	}
	// The zone as calendar.Parse reads it, so that the quota's key (its
	// period as Parse reads it) and its windows agree.
	day, err := calendar.Parse("day " + name)
	if err != nil {
		return nil, fmt.Errorf("the client's time zone %q: %w", name, err)
	}
	cfg := z.cfg
	cfg.Quotas = make([]fleetrate.Quota, len(z.cfg.Quotas))
	for i, q := range z.cfg.Quotas {
		if q.Period.Location == nil {
			q.Period.Location = day.Location
		}
		cfg.Quotas[i] = q
	}
	lim, err := fleetrate.New(p.m.store, cfg)
	if err != nil {
		return nil, fmt.Errorf("the client's time zone %q: %w", name, err)
	}
	if z.lims == nil {
		z.lims = make(map[string]*fleetrate.Limiter)
	}
	z.lims[name] = lim
	return lim, nil
}
