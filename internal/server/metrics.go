package server

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fleetrate/fleetrate"
)

// Label values of fleetrate_decisions_total's result.
const (
	resultAllowed    = "allowed"
	resultOverLimit  = "over_limit"
	resultShadow     = "shadow_over_limit"
	resultUnlimited  = "unlimited"
	resultUnmatched  = "unmatched"
	resultRefunded   = "refunded"
	resultError      = "error"
	labelUnknown     = "_unknown"
	labelUnmatched   = "_unmatched"
	labelOverride    = "_override"
	apiRLS           = "rls"
	apiTake          = "take"
	apiWait          = "wait"
	reloadSuccess    = "success"
	reloadFailure    = "failure"
	reloadUnchanged  = "unchanged"
	storeOpTake      = "take"
	storeOpRefund    = "refund"
	storeOpCancel    = "cancel"
	storeOpDrain     = "drain"
	storeOpReset     = "reset"
	storeOpSettle    = "settle"
	storeOpRelease   = "release"
	storeOpRenew     = "renew"
	metricsNamespace = "fleetrate"
)

type metrics struct {
	reg       *prometheus.Registry
	decisions *prometheus.CounterVec
	// counters caches decisions' counters by their labels (a decisionKey):
	// a decision finds its counter without hashing its labels under the
	// vector's lock. The vector's series are never deleted, so a cached
	// counter stays the one the vector exports.
	counters sync.Map
	// opTime is storeTime's observer of each store operation, created on
	// its first use as storeTime.WithLabelValues would create it.
	opTime     map[string]func() prometheus.Observer
	storeTime  *prometheus.HistogramVec
	storeErrs  *prometheus.CounterVec
	reloads    *prometheus.CounterVec
	nearLimit  *prometheus.CounterVec
	lastReload prometheus.Gauge
	// reloadFailing is 1 while the configuration on disk does not load:
	// from a failed reload until one that succeeds or finds the file
	// back to the configuration in force.
	reloadFailing prometheus.Gauge
	inflight      prometheus.Gauge
	// descriptors holds the descriptor label values exported, at most
	// maxDescriptors of them (nDescriptors); a decision of any other is
	// counted under OverflowDescriptor, and in dropped.
	descriptors    sync.Map
	nDescriptors   atomic.Int64
	maxDescriptors int64
	dropped        prometheus.Counter
	// permits are the in-flight permits' and settles' metrics
	// (permitmetrics.go).
	permits permitMetrics
}

// OverflowDescriptor is the descriptor label of the decisions and
// near-limit counts of descriptors beyond Options.MaxMetricDescriptors.
const OverflowDescriptor = "_overflow"

// DefaultMaxMetricDescriptors is the default of
// Options.MaxMetricDescriptors.
const DefaultMaxMetricDescriptors = 10000

// newMetrics returns the service's metrics, registered with reg. It is
// long because it is a table: each metric's name and help stand beside
// the field that holds it.
func newMetrics(reg *prometheus.Registry, maxDescriptors int64) *metrics {
	m := &metrics{
		reg:            reg,
		maxDescriptors: maxDescriptors,
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "metric_descriptors_dropped_total",
			Help:      "Decisions and near-limit counts recorded under descriptor=\"_overflow\" because --max-metric-descriptors other descriptor values were exported already (rules with detailed_metric or value_to_metric label each request value).",
		}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "decisions_total",
			Help:      "Rate-limit decisions by API (rls, take, wait), domain, descriptor or bucket, and result.",
		}, []string{"api", "domain", "descriptor", "result"}),
		storeTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metricsNamespace,
			Name:      "store_duration_seconds",
			Help:      "Latency of store operations, failed ones included.",
			Buckets:   []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"op"}),
		storeErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "store_errors_total",
			Help:      "Store operations that failed (store unavailable or timed out).",
		}, []string{"op"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "config_reloads_total",
			Help:      "Configuration reloads by result (success, failure, unchanged).",
		}, []string{"result"}),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace,
			Name:      "near_limit_total",
			Help:      "RLS tokens taken while a limit had more than the near-limit ratio (0.8) of its burst in use, as envoyproxy/ratelimit's near_limit, by domain and descriptor.",
		}, []string{"domain", "descriptor"}),
		lastReload: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace,
			Name:      "config_last_reload_success_timestamp_seconds",
			Help:      "When the configuration in force was loaded.",
		}),
		reloadFailing: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace,
			Name:      "config_reload_failing",
			Help:      "1 while the configuration on disk does not load and the previous one stays in force (from a failed reload until a reload succeeds or finds the file unchanged).",
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace,
			Name:      "requests_in_flight",
			Help:      "API requests being served (HTTP and gRPC).",
		}),
	}
	m.permits = newPermitMetrics(reg)
	m.opTime = map[string]func() prometheus.Observer{}
	for _, op := range []string{storeOpTake, storeOpRefund, storeOpCancel, storeOpDrain, storeOpReset, storeOpSettle, storeOpRelease, storeOpRenew} {
		m.opTime[op] = sync.OnceValue(func() prometheus.Observer { return m.storeTime.WithLabelValues(op) })
	}
	reg.MustRegister(m.decisions, m.storeTime, m.storeErrs, m.reloads, m.nearLimit, m.lastReload, m.reloadFailing, m.inflight, m.dropped,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every reload result is exported from the start at 0, so that a rate
	// or an alert on failures works before the first reload.
	for _, r := range []string{reloadSuccess, reloadFailure, reloadUnchanged} {
		m.reloads.WithLabelValues(r)
	}
	return m
}

// instrumented wraps a store with latency and error metrics.
type instrumented struct {
	fleetrate.Store
	m *metrics
}

var _ fleetrate.Store = instrumented{}

// Unwrap returns the store being measured, so that callers can find what
// it offers beyond fleetrate.Store (such as transport's Announcer).
func (s instrumented) Unwrap() fleetrate.Store { return s.Store }

// decisionKey is the labels of a decisions counter.
type decisionKey struct{ api, domain, descriptor, result string }

// decision counts one decision.
func (m *metrics) decision(api, domain, descriptor, result string) {
	k := decisionKey{api, domain, descriptor, result}
	if c, ok := m.counters.Load(k); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	label := m.descriptor(descriptor)
	c := m.decisions.WithLabelValues(api, domain, label, result)
	if label == descriptor {
		// Only an exported descriptor's counter is cached: the cache
		// must not grow with the values beyond the bound either.
		m.counters.Store(k, c)
	}
	c.Inc()
}

// descriptor returns the label under which descriptor d is exported: d,
// while fewer than maxDescriptors values are, else OverflowDescriptor.
// Without the bound a rule with detailed_metric made one series per
// request value: 200,000 client addresses made 200,000 series, an 18 MB
// scrape and 330 MiB of heap that no memory bound counted.
func (m *metrics) descriptor(d string) string {
	if _, ok := m.descriptors.Load(d); ok {
		return d
	}
	if m.nDescriptors.Add(1) > m.maxDescriptors {
		m.nDescriptors.Add(-1)
		m.dropped.Inc()
		return OverflowDescriptor
	}
	if _, loaded := m.descriptors.LoadOrStore(d, struct{}{}); loaded {
		m.nDescriptors.Add(-1)
	}
	return d
}

func (s instrumented) observe(op string, start time.Time, err error) {
	s.m.observe(op, start, err)
}

// observe records a store operation's latency, and its failure.
func (m *metrics) observe(op string, start time.Time, err error) {
	m.opTime[op]().Observe(time.Since(start).Seconds())
	if isStoreFailure(err) {
		m.storeErrs.WithLabelValues(op).Inc()
	}
}

// isStoreFailure reports whether err means the store did not answer: it
// failed or timed out. Invalid arguments and the caller's cancellation are
// not store failures.
func isStoreFailure(err error) bool {
	return err != nil && (errors.Is(err, fleetrate.ErrStoreUnavailable) || errors.Is(err, context.DeadlineExceeded))
}

// Take implements fleetrate.Store, timing the call.
func (s instrumented) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	start := time.Now()
	res, err := s.Store.Take(ctx, req)
	s.observe(storeOpTake, start, err)
	return res, err
}

// TakeMany implements fleetrate.MultiTaker: the takes go to the store
// together (see fleetrate.TakeMany), each timed as the call that
// decided it.
func (s instrumented) TakeMany(ctx context.Context, reqs []fleetrate.Request, res []fleetrate.Result, errs []error) {
	start := time.Now()
	// An error of TakeMany's own is in every errs[i] too.
	_ = fleetrate.TakeMany(ctx, s.Store, reqs, res, errs)
	for _, err := range errs {
		s.observe(storeOpTake, start, err)
	}
}

// Refund implements fleetrate.Store, timing the call.
func (s instrumented) Refund(ctx context.Context, buckets []fleetrate.Bucket, n int64, at time.Time) error {
	start := time.Now()
	err := s.Store.Refund(ctx, buckets, n, at)
	s.observe(storeOpRefund, start, err)
	return err
}

// Cancel implements fleetrate.Store, timing the call.
func (s instrumented) Cancel(ctx context.Context, buckets []fleetrate.Bucket, n int64, b fleetrate.Booking) error {
	start := time.Now()
	err := s.Store.Cancel(ctx, buckets, n, b)
	s.observe(storeOpCancel, start, err)
	return err
}

// Drain implements fleetrate.Store, timing the call.
func (s instrumented) Drain(ctx context.Context, buckets []fleetrate.Bucket, d time.Duration) error {
	start := time.Now()
	err := s.Store.Drain(ctx, buckets, d)
	s.observe(storeOpDrain, start, err)
	return err
}

// DrainEach implements fleetrate.Store, timing the call.
func (s instrumented) DrainEach(ctx context.Context, drains []fleetrate.Drain) error {
	start := time.Now()
	err := s.Store.DrainEach(ctx, drains)
	s.observe(storeOpDrain, start, err)
	return err
}

// Settle implements fleetrate.Store, timing the call.
func (s instrumented) Settle(ctx context.Context, buckets []fleetrate.Bucket, st fleetrate.Settlement) error {
	start := time.Now()
	err := s.Store.Settle(ctx, buckets, st)
	s.observe(storeOpSettle, start, err)
	return err
}

// Release implements fleetrate.Store, timing the call.
func (s instrumented) Release(ctx context.Context, buckets []fleetrate.Bucket, id string) (int, error) {
	start := time.Now()
	held, err := s.Store.Release(ctx, buckets, id)
	s.observe(storeOpRelease, start, err)
	return held, err
}

// Renew implements fleetrate.Store, timing the call.
func (s instrumented) Renew(ctx context.Context, buckets []fleetrate.Bucket, p fleetrate.Permit) (int, error) {
	start := time.Now()
	held, err := s.Store.Renew(ctx, buckets, p)
	s.observe(storeOpRenew, start, err)
	return held, err
}

// Reset implements fleetrate.Store, timing the call.
func (s instrumented) Reset(ctx context.Context, keys ...string) error {
	start := time.Now()
	err := s.Store.Reset(ctx, keys...)
	s.observe(storeOpReset, start, err)
	return err
}
