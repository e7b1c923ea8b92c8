package statuspage

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport"
)

// rateLimitedWindow is the span TransportUpstreams averages 429s over.
const rateLimitedWindow = time.Minute

// TransportUpstreams returns an upstream provider for Options.Upstreams
// that reports what package transport keeps, for each endpoint of ups:
//   - whether it is paused and for how long (a peek of its pause marker in
//     store, under prefix, the Limiter's prefix);
//   - its documented rate, the slowest of the endpoint's limits, and, when
//     adaptive pacing is on (adaptive is the Options.Adaptive the
//     transports are given, and the upstream is not Fixed), its effective
//     rate: the documented rate times transport.EffectiveFactor of the
//     endpoint bucket, the rate every transport of the fleet paces it at
//     now; and the same two rates of the channel's credential bucket, when
//     the upstream has credential limits;
//   - when gatherer is not nil, its rate-limit answers from the registry
//     the transports register their metrics on (transport.MetricRateLimited);
//   - when the endpoint, or its credential, bounds requests in flight
//     (transport.Endpoint.InFlight, Upstream.CredentialInFlight), the
//     permits held fleet-wide and the bound.
//
// Each call costs the store two peeks per endpoint, and two more per
// channel with credential limits, plus one per in-flight bound.
func TransportUpstreams(store fleetrate.Store, prefix string, ups []transport.Upstream, gatherer prometheus.Gatherer, adaptive transport.Adaptive) func(context.Context) ([]Upstream, error) {
	if prefix == "" {
		prefix = fleetrate.DefaultPrefix
	}
	var (
		mu      sync.Mutex
		history []limitedSample
	)
	clock := time.Now
	return func(ctx context.Context) ([]Upstream, error) {
		var rows []Upstream
		var errs []error
		for _, u := range ups {
			urows, uerrs := transportRows(ctx, store, prefix, u, adaptive)
			rows = append(rows, urows...)
			errs = append(errs, uerrs...)
		}
		if gatherer != nil {
			counts, err := rateLimitedCounts(gatherer)
			if err != nil {
				errs = append(errs, err)
			} else {
				mu.Lock()
				now := clock()
				history = append(history, limitedSample{at: now, counts: counts})
				from := 0
				for i, h := range history {
					if now.Sub(h.at) >= rateLimitedWindow {
						from = i
					}
				}
				history = history[from:]
				oldest := history[0]
				mu.Unlock()
				dt := now.Sub(oldest.at).Minutes()
				for i := range rows {
					k := [2]string{rows[i].Channel, rows[i].Endpoint}
					rows[i].RateLimited = counts[k]
					rows[i].RateLimitedPerMin = 0
					if dt > 0 {
						rows[i].RateLimitedPerMin = float64(counts[k]-oldest.counts[k]) / dt
					}
				}
			}
		}
		return rows, joinUnique(errs)
	}
}

// joinUnique joins errs, leaving out nils and errors whose message an
// earlier one already gave.
func joinUnique(errs []error) error {
	var out []error
	seen := map[string]bool{}
	for _, err := range errs {
		if err == nil {
			continue
		}
		if msg := err.Error(); !seen[msg] {
			seen[msg] = true
			out = append(out, err)
		}
	}
	return errors.Join(out...)
}

// transportRows reads the rows of one upstream's endpoints.
func transportRows(ctx context.Context, store fleetrate.Store, prefix string, u transport.Upstream, adaptive transport.Adaptive) ([]Upstream, []error) {
	var errs []error
	adapts := !adaptive.Off && !u.Fixed
	cred := fleetrate.Bucket{Prefix: prefix, Key: transport.CredentialBucket(u.Channel), Limits: u.Credential}
	var credPause time.Duration
	var credRate, credEffective float64
	if len(u.Credential) > 0 {
		var err error
		if credPause, err = pausedFor(ctx, store, cred); err != nil {
			errs = append(errs, err)
		}
		credRate = slowest(u.Credential)
		if adapts {
			credEffective, err = effectiveRate(ctx, store, cred, adaptive)
			errs = append(errs, err)
		}
	}
	var rows []Upstream
	for _, e := range u.Endpoints {
		b := fleetrate.Bucket{Prefix: prefix, Key: transport.EndpointBucket(u.Channel, e.Name), Limits: e.Limits}
		row := Upstream{
			Channel: u.Channel, Endpoint: e.Name, RateLimited: -1, RateLimitedPerMin: -1,
			DocumentedRate: slowest(e.Limits), CredentialRate: credRate, CredentialEffectiveRate: credEffective,
		}
		d, err := pausedFor(ctx, store, b)
		if err != nil {
			errs = append(errs, err)
		}
		switch {
		case d > 0:
			row.PausedFor, row.Reason = d, "upstream rate limit (Retry-After) on this endpoint"
		case credPause > 0:
			row.PausedFor, row.Reason = credPause, "upstream rate limit (Retry-After) on the channel's credential"
		}
		if adapts {
			row.EffectiveRate, err = effectiveRate(ctx, store, b, adaptive)
			errs = append(errs, err)
		}
		errs = append(errs, inFlightOf(ctx, store, prefix, u, e, &row))
		rows = append(rows, row)
	}
	return rows, errs
}

// slowest returns the lowest rate of limits, 0 when there are none.
func slowest(limits []fleetrate.Limit) float64 {
	r := math.Inf(1)
	for _, l := range limits {
		r = min(r, l.Rate)
	}
	if math.IsInf(r, 1) {
		return 0
	}
	return r
}

// effectiveRate reads the rate the fleet paces b at: its slowest limit
// times its shared effective factor (transport scales every limit of a
// bucket by the same factor). It is 0 when the read fails.
func effectiveRate(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket, a transport.Adaptive) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, peekTimeout)
	defer cancel()
	f, err := transport.EffectiveFactor(ctx, store, b, a)
	switch {
	case errors.Is(err, fleetrate.ErrInvalid):
		return 0, fmt.Errorf("adaptive settings: %w", err) // the same for every bucket
	case err != nil:
		return 0, fmt.Errorf("reading the effective rate of %s: %w", b.Key, err)
	}
	return slowest(b.Limits) * f, nil
}

type limitedSample struct {
	at     time.Time
	counts map[[2]string]int64
}

// pausedFor peeks the pause marker beside b: how much longer it is
// drained.
func pausedFor(ctx context.Context, store fleetrate.Store, b fleetrate.Bucket) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, peekTimeout)
	defer cancel()
	res, err := store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{{
		Prefix: b.Prefix, Key: transport.PauseBucket(b.Key), Limits: []fleetrate.Limit{transport.PauseLimit},
	}}})
	if err != nil {
		return 0, fmt.Errorf("peeking the pause of %s: %w", b.Key, err)
	}
	if res.Allowed {
		return 0, nil
	}
	return res.RetryAfter, nil
}

// rateLimitedCounts sums transport.MetricRateLimited over its codes, by
// channel and endpoint.
func rateLimitedCounts(g prometheus.Gatherer) (map[[2]string]int64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, fmt.Errorf("gathering metrics: %w", err)
	}
	out := map[[2]string]int64{}
	for _, mf := range mfs {
		if mf.GetName() != transport.MetricRateLimited {
			continue
		}
		for _, m := range mf.GetMetric() {
			var k [2]string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "channel":
					k[0] = lp.GetValue()
				case "endpoint":
					k[1] = lp.GetValue()
				}
			}
			out[k] += int64(m.GetCounter().GetValue())
		}
	}
	return out, nil
}
