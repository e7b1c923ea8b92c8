package httplimit

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate/internal/promreg"
)

// Outcomes, the values of the "outcome" label of
// fleetrate_http_requests_total.
const (
	OutcomeAllowed      = "allowed"       // admitted
	OutcomeDenied       = "denied"        // answered 429
	OutcomeShadowDenied = "shadow_denied" // would have been denied; admitted in shadow mode
	OutcomeFailOpen     = "fail_open"     // store failed; admitted
	OutcomeFailClosed   = "fail_closed"   // store failed; answered 503
	OutcomeNoKey        = "no_key"        // the key function failed
	OutcomeBadCost      = "bad_cost"      // the cost function failed, or the cost exceeds the burst
	OutcomeExempt       = "exempt"        // exempt from limiting (Config.Exempt); admitted
)

// metrics holds the collectors; every method is a no-op on a nil
// receiver, which is what a nil Registerer gives.
type metrics struct {
	requests    *prometheus.CounterVec
	storeErrors *prometheus.CounterVec
	storeTime   *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetrate_http_requests_total",
			Help: "Requests seen by the fleetrate HTTP middleware, by policy and outcome.",
		}, []string{"policy", "outcome"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fleetrate_http_store_errors_total",
			Help: "Failed rate-limit store calls of the fleetrate HTTP middleware, by policy.",
		}, []string{"policy"}),
		storeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fleetrate_http_store_duration_seconds",
			Help:    "Latency of the rate-limit store calls of the fleetrate HTTP middleware, by policy.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"policy"}),
	}
	var err error
	if m.requests, err = registerMetric(reg, m.requests); err != nil {
		return nil, err
	}
	if m.storeErrors, err = registerMetric(reg, m.storeErrors); err != nil {
		return nil, err
	}
	if m.storeTime, err = registerMetric(reg, m.storeTime); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) request(policy, outcome string) {
	if m != nil {
		m.requests.WithLabelValues(policy, outcome).Inc()
	}
}

func (m *metrics) storeError(policy string) {
	if m != nil {
		m.storeErrors.WithLabelValues(policy).Inc()
	}
}

func (m *metrics) observe(policy string, d time.Duration) {
	if m != nil {
		m.storeTime.WithLabelValues(policy).Observe(d.Seconds())
	}
}

// registerMetric registers c, or returns the equal collector already
// registered by another user of the same registry.
func registerMetric[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	c, err := promreg.Register(reg, c)
	if err != nil {
		return c, fmt.Errorf("httplimit: registering metrics: %w", err)
	}
	return c, nil
}
