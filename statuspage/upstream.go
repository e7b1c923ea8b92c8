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
// that reports what package transport keeps today: whether each endpoint
// of ups is paused and for how long (a peek of its pause marker in store,
// under prefix, the Limiter's prefix), and, when gatherer is not nil, its
// rate-limit answers from the registry the transports register their
// metrics on (transport.MetricRateLimited). The documented rate is the
// slowest of the endpoint's limits. It knows no effective rate.
func TransportUpstreams(store fleetrate.Store, prefix string, ups []transport.Upstream, gatherer prometheus.Gatherer) func(context.Context) ([]Upstream, error) {
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
			credPause, err := pausedFor(ctx, store, prefix, transport.CredentialBucket(u.Channel))
			if err != nil && len(u.Credential) > 0 {
				errs = append(errs, err)
			}
			for _, e := range u.Endpoints {
				row := Upstream{Channel: u.Channel, Endpoint: e.Name, RateLimited: -1, RateLimitedPerMin: -1}
				row.DocumentedRate = math.Inf(1)
				for _, l := range e.Limits {
					row.DocumentedRate = min(row.DocumentedRate, l.Rate)
				}
				if math.IsInf(row.DocumentedRate, 1) {
					row.DocumentedRate = 0
				}
				d, err := pausedFor(ctx, store, prefix, transport.EndpointBucket(u.Channel, e.Name))
				if err != nil {
					errs = append(errs, err)
				}
				switch {
				case d > 0:
					row.PausedFor, row.Reason = d, "upstream rate limit (Retry-After) on this endpoint"
				case credPause > 0 && len(u.Credential) > 0:
					row.PausedFor, row.Reason = credPause, "upstream rate limit (Retry-After) on the channel's credential"
				}
				rows = append(rows, row)
			}
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
		return rows, errors.Join(errs...)
	}
}

type limitedSample struct {
	at     time.Time
	counts map[[2]string]int64
}

// pausedFor peeks the pause marker beside bucket: how much longer it is
// drained.
func pausedFor(ctx context.Context, store fleetrate.Store, prefix, bucket string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, peekTimeout)
	defer cancel()
	res, err := store.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{{
		Prefix: prefix, Key: transport.PauseBucket(bucket), Limits: []fleetrate.Limit{transport.PauseLimit},
	}}})
	if err != nil {
		return 0, fmt.Errorf("peeking the pause of %s: %w", bucket, err)
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
