package main

// This file is the service's safety settings: the failure policy and
// circuit breaker (package failsafe) in front of a Redis store, and the
// bound on decisions in flight (server.Options.MaxInFlight and
// LatencyTarget).

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server"
)

// defaultFailurePolicy is the service's failure policy: a decision the
// store cannot make is an error (gRPC UNAVAILABLE, HTTP 503), so that
// Envoy's own failure_mode_deny decides, as it did before the breaker.
const defaultFailurePolicy = failsafe.FailClosed

// safetySettings are the resolved safety settings of one run.
type safetySettings struct {
	policy      failsafe.Policy
	failures    int64
	coolOff     time.Duration
	fleetSize   int64
	maxInFlight int64
	// latencyTarget is --latency-target; 0 turns the adaptive limit off.
	latencyTarget time.Duration
}

// addSafetyFlags adds the safety settings' flags to f.
func addSafetyFlags(f *pflag.FlagSet) {
	f.String("failure-policy", defaultFailurePolicy.String(), "what a decision is while Redis fails (package failsafe): fail_closed answers UNAVAILABLE (HTTP 503) so that Envoy's failure_mode_deny decides; fail_open allows; local_fallback decides in memory at the limits divided by --fleet-size")
	f.Int64("breaker-failures", failsafe.DefaultFailureThreshold, "consecutive failed store calls that open the circuit breaker; while open, decisions follow --failure-policy without calling Redis")
	f.Duration("breaker-cool-off", failsafe.DefaultCoolOff, "how long the open breaker keeps calls from Redis before one probe")
	f.Int64("fleet-size", 1, "with --failure-policy local_fallback: how many service replicas share the limits (each decides at 1/fleet-size of them)")
	f.Int64("max-in-flight", server.DefaultMaxInFlight(), "hard cap on decisions in flight (RLS calls and API requests); beyond the concurrency limit, which never exceeds it, they are answered at once with gRPC RESOURCE_EXHAUSTED or HTTP 503 and Retry-After")
	f.Duration("latency-target", server.DefaultLatencyTarget, "queue the concurrency limit keeps the median decision under: while more than half of the decisions take longer than the fastest of the last minute or so by more, the limit on decisions in flight falls (down to 1), and climbs back to --max-in-flight while they do not; 0 turns it off (the limit is --max-in-flight)")
}

// safety resolves the safety settings, with s the file's server section.
func (r *resolver) safety(s config.Settings) safetySettings {
	out := safetySettings{
		failures:      r.int64("breaker-failures", s.BreakerFailures),
		coolOff:       r.dur("breaker-cool-off", s.BreakerCoolOff),
		fleetSize:     r.int64("fleet-size", s.FleetSize),
		maxInFlight:   r.int64("max-in-flight", s.MaxInFlight),
		latencyTarget: r.dur("latency-target", s.LatencyTarget),
	}
	name := r.str("failure-policy", s.FailurePolicy)
	p, err := failsafe.ParsePolicy(name)
	if err != nil {
		r.fail("failure-policy", name, fmt.Errorf("want fail_open, fail_closed or local_fallback"))
	}
	out.policy = p
	if out.coolOff == 0 {
		r.fail("breaker-cool-off", "0s", fmt.Errorf("must be above 0 (the default is %v)", failsafe.DefaultCoolOff))
	}
	return out
}

// safeServerOptions are the server's options for st, serving store: with
// the bound on decisions in flight, and, for Redis, the failure policy and
// the breaker in front of it, whose state /readyz and the metrics show.
func (st *serveSettings) safeServerOptions(store serveStore, tlsCfg *tls.Config, log *slog.Logger) (server.Options, error) {
	opts := st.serverOptions(store, tlsCfg, log)
	opts.MaxInFlight = st.safety.maxInFlight
	opts.LatencyTarget = st.safety.latencyTarget
	if opts.LatencyTarget == 0 {
		opts.LatencyTarget = -1 // off: the server's zero is its default
	}
	if st.redis == "" {
		return opts, nil // the in-memory store does not fail
	}
	opts.Registry = prometheus.NewRegistry()
	guarded, b, err := withBreaker(store, st.safety, opts.Registry, log)
	if err != nil {
		return opts, err
	}
	opts.Store, opts.Breaker = guarded.store, b
	return opts, nil
}

// withBreaker puts the failure policy and the circuit breaker in front of
// an opened Redis store; its metrics (fleetrate_breaker_open, ...) go to
// reg.
func withBreaker(store serveStore, sf safetySettings, reg prometheus.Registerer, log *slog.Logger) (serveStore, *failsafe.Store, error) {
	fs, err := failsafe.New(store.store, failsafe.Options{
		Name:             "redis",
		Policy:           sf.policy,
		FleetSize:        int(sf.fleetSize),
		FailureThreshold: int(sf.failures),
		CoolOff:          sf.coolOff,
		Logger:           log,
		Registerer:       reg,
	})
	if err != nil {
		return store, nil, err
	}
	store.store = fs
	return store, fs, nil
}
