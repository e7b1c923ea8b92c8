package transport

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/pacer"
)

// Metric names of in-flight bounds (Endpoint.InFlight,
// Upstream.CredentialInFlight), labelled by channel and endpoint.
const (
	// MetricPermitsHeld is how many of this process's requests hold an
	// in-flight permit: sent, and their response body not yet read to its
	// end nor closed.
	MetricPermitsHeld = "fleetrate_transport_permits_held"
	// MetricPermitsWaiting is how many of this process's requests of an
	// endpoint with an in-flight bound are waiting for their turn: for a
	// permit, or for their tokens.
	MetricPermitsWaiting = "fleetrate_transport_permits_waiting"
	// MetricPermitsLapsed counts permits lost to their lease's end, with a
	// cause label: "unclosed" for a response body dropped without being
	// read to its end or closed (its permit lapses PermitTTL later),
	// "failed_after_send" for a round trip that failed after the request
	// was written (a timeout, a cancel, a reset: the upstream may still be
	// running it, so its permit lapses PermitTTL later rather than going
	// back), "renewal" for a lease that lapsed while held because renewals
	// did not reach the store in time. Alert on "unclosed" and "renewal";
	// watch "failed_after_send" beside the request timeouts.
	MetricPermitsLapsed = "fleetrate_transport_permits_lapsed_total"
)

// permitMetrics are the in-flight bounds' collectors; nil means none.
type permitMetrics struct {
	held, waiting *prometheus.GaugeVec
	lapsed        *prometheus.CounterVec
}

// newPermitMetrics registers the in-flight collectors on reg (nil: none).
func newPermitMetrics(reg prometheus.Registerer) (*permitMetrics, error) {
	if reg == nil {
		return nil, nil
	}
	labels := []string{"channel", "endpoint"}
	m := &permitMetrics{}
	var err error
	if m.held, err = registerMetric(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricPermitsHeld,
		Help: "Requests holding an in-flight permit: sent, their response body not yet read to its end nor closed."}, labels)); err != nil {
		return nil, err
	}
	if m.waiting, err = registerMetric(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricPermitsWaiting,
		Help: "Requests of an endpoint with an in-flight bound waiting for their turn (a permit and tokens)."}, labels)); err != nil {
		return nil, err
	}
	if m.lapsed, err = registerMetric(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricPermitsLapsed,
		Help: "In-flight permits lost to their lease's end: a response body never closed, or renewals that failed."}, append(labels, "cause"))); err != nil {
		return nil, err
	}
	return m, nil
}

// gauge adds d to the gauge g selects, when there are metrics.
func (m *permitMetrics) gauge(g func(*permitMetrics) *prometheus.GaugeVec, tg Target, d float64) {
	if m != nil {
		g(m).WithLabelValues(tg.Channel, tg.Endpoint).Add(d)
	}
}

// lapse counts a lapsed permit.
func (m *permitMetrics) lapse(tg Target, cause string) {
	if m != nil {
		m.lapsed.WithLabelValues(tg.Channel, tg.Endpoint, cause).Inc()
	}
}

// bounded reports whether one of pt's buckets bounds in-flight requests.
func (t *Transport) bounded(pt pacer.Target) bool {
	for _, name := range pt.Buckets {
		if b, err := t.lim.Bucket(name); err == nil && b.InFlight > 0 {
			return true
		}
	}
	return false
}

// wait is the pacer's Wait, counted in the waiting gauge when the target
// bounds in-flight requests.
func (t *Transport) wait(ctx context.Context, tg Target, pt pacer.Target) (*fleetrate.Reservation, bool, error) {
	if t.pm != nil && t.bounded(pt) {
		t.pm.gauge(waitingGauge, tg, 1)
		defer t.pm.gauge(waitingGauge, tg, -1)
	}
	return t.pacer.Wait(ctx, pt)
}

func waitingGauge(m *permitMetrics) *prometheus.GaugeVec { return m.waiting }
func heldGauge(m *permitMetrics) *prometheus.GaugeVec    { return m.held }

// held is what a request holds while its answer is out: the booking it
// went out on, with its in-flight permit, and its costs to settle. It
// ends once: when the round trip fails, or the response body is read to
// its end or closed (end), or the body is dropped unclosed (abandon).
type held struct {
	t      *Transport
	ctx    context.Context // the request's, for its log events
	tg     Target
	attrs  []slog.Attr
	r      *fleetrate.Reservation
	permit bool // r holds an in-flight permit
	ended  atomic.Bool
	// handed is set once the answer's body is watched: from then on the
	// body ends the hold.
	handed bool
	// asked and wrote record what the request's client trace saw: a
	// connection asked for, and the request's headers written on it.
	asked, wrote atomic.Bool
}

// hold returns the hold of a request sent on r, or nil when there is
// nothing to hold: no booking (unpaced), or neither a permit nor a
// settle.
func (t *Transport) hold(ctx context.Context, tg Target, attrs []slog.Attr, r *fleetrate.Reservation) *held {
	if r == nil {
		return nil
	}
	h := &held{t: t, ctx: ctx, tg: tg, attrs: attrs, r: r, permit: r.Result.InFlight.Bound > 0}
	if !h.permit && tg.Settle == nil {
		return nil
	}
	if h.permit {
		t.pm.gauge(heldGauge, tg, 1)
	}
	return h
}

// drop ends a hold whose request never handed its answer's body to the
// caller (it failed before, or between, sends): the permit goes back.
func (h *held) drop() {
	if h != nil && !h.handed {
		h.end(nil, nil)
	}
}

// traced returns req with a client trace that records whether it was
// written, so that a failed round trip knows whether the upstream may be
// running it. It returns req itself when there is no permit to keep.
func (h *held) traced(req *http.Request) *http.Request {
	if h == nil || !h.permit {
		return req
	}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GetConn:      func(string) { h.asked.Store(true) },
		WroteHeaders: func() { h.wrote.Store(true) },
	}))
}

// mayRun reports whether the upstream may be running a request whose
// round trip failed: its headers were written, or the base transport
// reports no trace at all, so nothing says they were not.
func (h *held) mayRun() bool {
	return h.wrote.Load() || !h.asked.Load()
}

// answer takes the base transport's answer to the held request: a round
// trip that failed before the request was written ends the hold at once,
// one that failed after it (a timeout, a cancel, a reset) abandons its
// permit, which lapses at the end of its lease, since the upstream may
// still be running the request; a response's body ends the hold when read
// to its end or closed.
func (h *held) answer(resp *http.Response, err error) *http.Response {
	if h == nil {
		return resp
	}
	h.handed = true
	if err != nil || resp == nil {
		if h.permit && err != nil && h.mayRun() {
			h.abandon("failed_after_send", "rate_permit_abandoned")
			return resp
		}
		h.end(nil, nil)
		return resp
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		h.end(resp, nil)
		return resp
	}
	b := &body{rc: resp.Body, h: h, resp: resp, keep: h.tg.Settle != nil && !IsRateLimited(resp)}
	resp.Body = b
	if w, ok := b.rc.(io.Writer); ok {
		// A 101 Switching Protocols answer's body is the connection, an
		// io.ReadWriteCloser: keep it one.
		resp.Body = rwBody{b, w}
	}
	// A body dropped unclosed ends nothing: its request may still be
	// running upstream. Stop renewing the permit, so that it lapses at
	// the end of its lease, and say so.
	runtime.AddCleanup(b, func(h *held) { h.abandon("unclosed", "rate_body_unclosed") }, h)
	return resp
}

// end settles the request's booking to the answer, when it has a Settle
// and the answer is one to settle (resp not nil, not a rate limit), then
// releases its permit. It runs once.
func (h *held) end(resp *http.Response, kept []byte) {
	if !h.ended.CompareAndSwap(false, true) {
		return
	}
	t := h.t
	ctx, cancel := context.WithTimeout(context.WithoutCancel(h.ctx), storeTimeout)
	defer cancel()
	if h.tg.Settle != nil && resp != nil && !IsRateLimited(resp) {
		h.settle(ctx, resp, kept)
	}
	if !h.permit {
		return
	}
	t.pm.gauge(heldGauge, h.tg, -1)
	if h.r.Lapsed() {
		t.pm.lapse(h.tg, "renewal")
		t.log.LogAttrs(h.ctx, slog.LevelWarn, "rate_permit_lapsed", append(h.attrs, slog.String("cause", "renewal"))...)
	}
	if err := h.r.Release(ctx); err != nil {
		t.log.LogAttrs(h.ctx, slog.LevelError, "rate_store_error", append(h.attrs, slog.String("error", err.Error()))...)
	}
}

// settle settles the booking to the costs the target's Settle reads from
// the answer.
func (h *held) settle(ctx context.Context, resp *http.Response, kept []byte) {
	costs, err := h.tg.Settle(resp, kept)
	if err != nil {
		h.t.log.LogAttrs(h.ctx, slog.LevelWarn, "rate_settle_error", append(h.attrs, slog.String("error", err.Error()))...)
		return
	}
	h.t.settle(ctx, h.tg, h.attrs, h.r, costs)
}

// settle settles r, a booking of tg, to what it really cost the meters,
// costs by meter name, logging a failure as rate_settle_error.
func (t *Transport) settle(ctx context.Context, tg Target, attrs []slog.Attr, r *fleetrate.Reservation, costs map[string]int64) {
	if len(costs) == 0 {
		return
	}
	actual := make([]fleetrate.Cost, 0, len(costs))
	for name, n := range costs {
		actual = append(actual, fleetrate.Cost{Bucket: MeterBucket(tg.Channel, name), N: n})
	}
	if err := r.Settle(ctx, actual...); err != nil {
		t.log.LogAttrs(ctx, slog.LevelWarn, "rate_settle_error", append(attrs, slog.String("error", err.Error()))...)
	}
}

// abandon ends a hold whose request may still be running upstream: a
// response body dropped without being read to its end or closed, or a
// round trip that failed after the request was written. Its permit is no
// longer renewed and lapses at the end of its lease; the lapse is counted
// with cause and logged as event.
func (h *held) abandon(cause, event string) {
	if !h.ended.CompareAndSwap(false, true) {
		return
	}
	h.r.Abandon()
	if !h.permit {
		return
	}
	level := slog.LevelError // a body dropped unclosed is the caller's bug
	if cause != "unclosed" {
		level = slog.LevelWarn
	}
	h.t.pm.gauge(heldGauge, h.tg, -1)
	h.t.pm.lapse(h.tg, cause)
	h.t.log.LogAttrs(h.ctx, level, event, append(h.attrs,
		slog.Int64("lapses_in_ms", h.t.lim.PermitTTL().Milliseconds()))...)
}

// body is a response body that ends its request's hold when read to its
// end or closed, keeping what the caller reads for a Settle.
type body struct {
	rc   io.ReadCloser
	h    *held
	resp *http.Response
	keep bool
	mu   sync.Mutex
	kept []byte
}

// Read reads the response body; at its end, the hold ends.
func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	if b.keep && n > 0 && len(b.kept) < MaxSettleBody {
		b.kept = append(b.kept, p[:min(n, MaxSettleBody-len(b.kept))]...)
	}
	b.mu.Unlock()
	if err == io.EOF {
		b.finish()
	}
	return n, err
}

// Close closes the response body and ends the hold.
func (b *body) Close() error {
	err := b.rc.Close()
	b.finish()
	return err
}

// finish ends the hold with what was read.
func (b *body) finish() {
	b.mu.Lock()
	kept := b.kept
	b.mu.Unlock()
	b.h.end(b.resp, kept)
}

// rwBody is a body that is also the connection (101 Switching Protocols).
type rwBody struct {
	*body
	w io.Writer
}

// Write writes to the connection.
func (b rwBody) Write(p []byte) (int, error) { return b.w.Write(p) }
