package transport

import (
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate/internal/promreg"
	"github.com/fleetrate/fleetrate/transport/internal/pacer"
)

// Metric names, all labelled by channel and endpoint.
const (
	// MetricWaits counts requests that had to wait for the shared bucket.
	MetricWaits = "fleetrate_transport_waits_total"
	// MetricWaitSeconds is a histogram of the time each request waited for
	// the shared bucket, zero waits included.
	MetricWaitSeconds = "fleetrate_transport_wait_seconds"
	// MetricRateLimited counts upstream answers that were rate limits (429,
	// or 503 with Retry-After), with a code label.
	MetricRateLimited = "fleetrate_transport_rate_limited_total"
	// MetricRetries counts retries sent after a rate limit.
	MetricRetries = "fleetrate_transport_retries_total"
	// MetricBackpressure counts requests refused because the wait would
	// exceed the max wait.
	MetricBackpressure = "fleetrate_transport_backpressure_total"
	// MetricGaveUp counts requests that stayed rate limited through every
	// attempt.
	MetricGaveUp = "fleetrate_transport_gave_up_total"
	// MetricEffectiveRate is the rate, in tokens per second, that this
	// process last paced a bucket at (the documented rate lowered by
	// adaptive pacing), labelled by bucket too: the endpoint's and the
	// credential's.
	MetricEffectiveRate = "fleetrate_transport_effective_rate"
	// MetricPersistent counts rate limits answered while the effective
	// rate was already at its floor (see ErrPersistentLimit): alert on it.
	MetricPersistent = "fleetrate_transport_persistent_limit_total"
	// MetricLateRebooked counts requests booked again because their
	// process woke later after their slot than their buckets' bursts
	// tolerate (see Options): a sign of CPU starvation.
	MetricLateRebooked = "fleetrate_transport_late_rebooked_total"
	// MetricSpacingHolds counts requests of an endpoint with a spacing gate
	// (see Endpoint.Spacing) that left or came back late enough to hold
	// the gate shut for the next one.
	MetricSpacingHolds = "fleetrate_transport_spacing_holds_total"
	// MetricHeaders counts the upstream's rate-limit fields the transport
	// read (see RateLimitHeaders), labelled by result: "read" for an
	// answer that stated its requests' quota, or the reason a value was
	// ignored ("garbage", "negative", "remaining_above_limit",
	// "conflict", "reset_too_far", "reset_past", "missing").
	MetricHeaders = "fleetrate_transport_upstream_headers_total"
	// MetricHeaderHolds counts the holds an answer's fields put on the
	// fleet before any 429: fewer requests remaining than the bucket
	// would grant before the reset, or a stated limit that lowered the
	// rate (see RateLimitHeaders).
	MetricHeaderHolds = "fleetrate_transport_header_holds_total"
)

// waitBuckets are the histogram bounds in seconds, from a millisecond to
// past the default max wait.
var waitBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

type metrics struct {
	waits        *prometheus.CounterVec
	waitSeconds  *prometheus.HistogramVec
	limited      *prometheus.CounterVec
	retries      *prometheus.CounterVec
	backpressure *prometheus.CounterVec
	gaveUp       *prometheus.CounterVec
	effective    *prometheus.GaugeVec
	persist      *prometheus.CounterVec
	rebook       *prometheus.CounterVec
	spacingHolds *prometheus.CounterVec
	headers      *prometheus.CounterVec
	headerHolds  *prometheus.CounterVec
}

// newMetrics registers the transport's collectors on reg. Transports that
// share a Registerer share the collectors. A nil reg means no metrics.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := []string{"channel", "endpoint"}
	counter := func(name, help string, extra ...string) (*prometheus.CounterVec, error) {
		return registerMetric(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append(labels, extra...)))
	}
	m := &metrics{}
	var err error
	if m.waits, err = counter(MetricWaits, "Requests that waited for the shared rate-limit bucket."); err != nil {
		return nil, err
	}
	if m.waitSeconds, err = registerMetric(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    MetricWaitSeconds,
		Help:    "Time requests waited for the shared rate-limit bucket.",
		Buckets: waitBuckets,
	}, labels)); err != nil {
		return nil, err
	}
	if m.limited, err = counter(MetricRateLimited, "Upstream rate-limit answers (429, or 503 with Retry-After).", "code"); err != nil {
		return nil, err
	}
	if m.retries, err = counter(MetricRetries, "Retries sent after an upstream rate limit."); err != nil {
		return nil, err
	}
	if m.backpressure, err = counter(MetricBackpressure, "Requests refused because the wait would exceed the max wait."); err != nil {
		return nil, err
	}
	if m.gaveUp, err = counter(MetricGaveUp, "Requests still rate limited after every attempt."); err != nil {
		return nil, err
	}
	if m.effective, err = registerMetric(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: MetricEffectiveRate,
		Help: "Rate (tokens/s) this process last paced the bucket at, after adaptive pacing.",
	}, append(labels, "bucket"))); err != nil {
		return nil, err
	}
	if m.persist, err = counter(MetricPersistent, "Rate limits answered while the effective rate was at its floor."); err != nil {
		return nil, err
	}
	if m.rebook, err = counter(MetricLateRebooked, "Requests booked again because their process woke too late after their slot."); err != nil {
		return nil, err
	}
	if m.spacingHolds, err = counter(MetricSpacingHolds, "Requests that left or came back late enough to hold their endpoint's spacing gate shut for the next one."); err != nil {
		return nil, err
	}
	if m.headers, err = counter(MetricHeaders, "Upstream rate-limit header fields read, or ignored by reason.", "result"); err != nil {
		return nil, err
	}
	if m.headerHolds, err = counter(MetricHeaderHolds, "Holds of the fleet taken from an upstream's rate-limit header fields."); err != nil {
		return nil, err
	}
	return m, nil
}

// headerRead counts an answer's rate-limit fields read, or a value of
// them ignored, by result.
func (m *metrics) headerRead(t Target, result string) {
	if m != nil {
		m.headers.WithLabelValues(t.Channel, t.Endpoint, result).Inc()
	}
}

// HeaderHeld implements pacer.Events.
func (m *metrics) HeaderHeld(channel, endpoint string) {
	m.inc(func(m *metrics) *prometheus.CounterVec { return m.headerHolds }, channel, endpoint)
}

// rateLimited counts a rate-limited answer to tg's request.
func (m *metrics) rateLimited(t Target, code int) {
	if m != nil {
		m.limited.WithLabelValues(t.Channel, t.Endpoint, strconv.Itoa(code)).Inc()
	}
}

// retried counts a retry of tg's request.
func (m *metrics) retried(t Target) {
	if m != nil {
		m.retries.WithLabelValues(t.Channel, t.Endpoint).Inc()
	}
}

// gaveUpOn counts a request of tg that gave up.
func (m *metrics) gaveUpOn(t Target) {
	if m != nil {
		m.gaveUp.WithLabelValues(t.Channel, t.Endpoint).Inc()
	}
}

// The pacer's events (pacer.Events).
var _ pacer.Events = (*metrics)(nil)

// Waited implements pacer.Events.
func (m *metrics) Waited(channel, endpoint string, d time.Duration) {
	if m == nil {
		return
	}
	if d > 0 {
		m.waits.WithLabelValues(channel, endpoint).Inc()
	}
	m.waitSeconds.WithLabelValues(channel, endpoint).Observe(d.Seconds())
}

// Backpressured implements pacer.Events.
func (m *metrics) Backpressured(channel, endpoint string) {
	m.inc(func(m *metrics) *prometheus.CounterVec { return m.backpressure }, channel, endpoint)
}

// EffectiveRate implements pacer.Events.
func (m *metrics) EffectiveRate(channel, endpoint, bucket string, rate float64) {
	if m != nil {
		m.effective.WithLabelValues(channel, endpoint, bucket).Set(rate)
	}
}

// Persistent implements pacer.Events.
func (m *metrics) Persistent(channel, endpoint string) {
	m.inc(func(m *metrics) *prometheus.CounterVec { return m.persist }, channel, endpoint)
}

// Rebooked implements pacer.Events.
func (m *metrics) Rebooked(channel, endpoint string) {
	m.inc(func(m *metrics) *prometheus.CounterVec { return m.rebook }, channel, endpoint)
}

// SpacingHeld implements pacer.Events.
func (m *metrics) SpacingHeld(channel, endpoint string) {
	m.inc(func(m *metrics) *prometheus.CounterVec { return m.spacingHolds }, channel, endpoint)
}

// inc increments the counter c selects, when there are metrics.
func (m *metrics) inc(c func(*metrics) *prometheus.CounterVec, channel, endpoint string) {
	if m != nil {
		c(m).WithLabelValues(channel, endpoint).Inc()
	}
}

// registerMetric registers c, or returns the equal collector already
// registered by another user of the same registry.
func registerMetric[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	c, err := promreg.Register(reg, c)
	if err != nil {
		return c, fmt.Errorf("transport: registering metrics: %w", err)
	}
	return c, nil
}
