package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
)

// Outcomes of a settle, the label of fleetrate_settles_total.
const (
	settleRefunded = "refunded" // some bucket was charged less than taken
	settleCharged  = "charged"  // some bucket owes more, none got any back
	settleEven     = "even"     // the work cost what was taken
	settleRefused  = "refused"  // no grant, or a grant refused (spent, forged, another's)
	settleInvalid  = "invalid"  // bad costs, actual costs or time
	settleError    = "error"    // the store failed
)

// permitMetrics are the in-flight permits' and settles' metrics. Bucket
// labels are configured buckets only (the decide API's), so that the raw
// store API's keys cannot multiply the series.
type permitMetrics struct {
	held    *prometheus.GaugeVec
	waiting prometheus.Gauge
	lapsed  *prometheus.CounterVec
	settles *prometheus.CounterVec
}

func newPermitMetrics(reg *prometheus.Registry) permitMetrics {
	m := permitMetrics{
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace,
			Name:      "permits_held",
			Help:      "In-flight permits held across the fleet in a configured bucket with in_flight, as the store counted them at this instance's last /v1/acquire or /v1/take of it.",
		}, []string{"bucket"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace,
			Name:      "permit_waiters",
			Help:      "/v1/acquire calls of this instance waiting in a bucket's queue for a permit.",
		}),
		lapsed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "permits_lapsed_total",
			Help:      "Releases and renews (op) that found a bounded bucket without the permit: its lease had ended before (expired unreleased), or it was released already.",
		}, []string{"op"}),
		settles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "settles_total",
			Help:      "Settles of grants by outcome: refunded, charged, even, refused (grant missing or refused), invalid, error (store failed).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{settleRefunded, settleCharged, settleEven, settleRefused, settleInvalid, settleError} {
		m.settles.WithLabelValues(o)
	}
	for _, op := range []string{storeOpRelease, storeOpRenew} {
		m.lapsed.WithLabelValues(op)
	}
	reg.MustRegister(m.held, m.waiting, m.lapsed, m.settles)
	return m
}

// settle counts a settle's outcome.
func (m *metrics) settle(outcome string) {
	m.permits.settles.WithLabelValues(outcome).Inc()
}

// settleOutcome names what a settle did.
func settleOutcome(st fleetrate.Settlement) string {
	out := settleEven
	for i := range st.Costs {
		switch {
		case st.Actual[i] < st.Costs[i]:
			return settleRefunded
		case st.Actual[i] > st.Costs[i]:
			out = settleCharged
		}
	}
	return out
}

// permitLapsed counts a release or renew (op) that found fewer of the
// bounded buckets holding the permit than there are.
func (m *metrics) permitLapsed(op string, err error, held int, bs []fleetrate.Bucket) {
	if err != nil {
		return
	}
	bounded := 0
	for _, b := range bs {
		if b.InFlight > 0 {
			bounded++
		}
	}
	if held < bounded {
		m.permits.lapsed.WithLabelValues(op).Inc()
	}
}

// permitsHeld records where a configured bucket's bound stands.
func (m *metrics) permitsHeld(bucket string, f fleetrate.InFlight) {
	if f.Bound > 0 {
		m.permits.held.WithLabelValues(bucket).Set(float64(f.Held))
	}
}
