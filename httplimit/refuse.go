package httplimit

import (
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// refuse answers a request the store refused: 429 with Retry-After, or in
// shadow mode the handler's own answer.
func (p *policy) refuse(w http.ResponseWriter, r *http.Request, res fleetrate.Result, item string, next http.Handler) {
	m := p.m
	attrs := []slog.Attr{
		slog.String("policy", item), slog.Int64("cost", res.N),
		slog.Duration("retry_after", retryAfter(res)), slog.String("method", r.Method), slog.String("path", r.URL.Path),
	}
	if p.shadow {
		m.metrics.request(p.name, OutcomeShadowDenied)
		m.log.LogAttrs(r.Context(), slog.LevelInfo, "fleetrate: shadow mode: request would be rate limited", attrs...)
		next.ServeHTTP(w, r)
		return
	}
	m.metrics.request(p.name, OutcomeDenied)
	m.log.LogAttrs(r.Context(), slog.LevelDebug, "fleetrate: request rate limited", attrs...)
	after := retryAfter(res)
	retry := max(headers.DelaySeconds(after), 1)
	w.Header().Set(HeaderRetryAfter, strconv.FormatInt(retry, 10))
	i := p.limitIndex(res)
	detail := fmt.Sprintf("the quota of policy %q (%d %s per %ds) is exhausted for this client; retry in %d s",
		item, p.quotas[i], p.unit, p.windows[i], retry)
	if res.N != 1 {
		detail = fmt.Sprintf("this request costs %d %s; %s", res.N*p.upt, p.unit, detail)
	}
	if res.QuotaDenied && res.Quota >= 0 && res.Quota < len(res.Quotas) {
		detail = p.quotaDetail(res, item, retry)
	}
	m.refused(w, r, Refusal{
		Status: http.StatusTooManyRequests, Policy: item, Cost: res.N * p.upt, RetryAfter: after, Result: res,
		Problem: Problem{
			Type:             ProblemQuotaExceeded,
			Title:            "Quota Exceeded",
			Detail:           detail,
			ViolatedPolicies: []string{item},
		},
	})
}

func defaultRefused(w http.ResponseWriter, _ *http.Request, ref Refusal) {
	writeProblem(w, ref.Status, &ref.Problem)
}

func defaultUnavailable(w http.ResponseWriter, _ *http.Request, _ error) {
	writeProblem(w, http.StatusServiceUnavailable, &Problem{
		Title:  http.StatusText(http.StatusServiceUnavailable),
		Detail: "the rate limiter is unavailable; retry shortly",
	})
}

// limitIndex returns the index in the policy's limits of the limit that
// decided res: the store says which (Result.LimitIndex). A store that
// names a limit the policy does not have is answered as if by the first.
func (p *policy) limitIndex(res fleetrate.Result) int {
	if i := res.LimitIndex; i > 0 && i < len(p.limits) {
		return i
	}
	return 0
}

// setHeaders sets the RateLimit fields (and the legacy ones) for a
// decision and returns the name of the limit reported.
//
// The reported limit is the one that decided: for a denial the limit that
// refused, otherwise the one with the fewest tokens left. "r" is its
// tokens left and "t" the effective window (see headers.EffectiveWindow), both in
// quota units and rounded down, so that neither promises more than the
// bucket admits. For a denial "t" never ends after Retry-After. The legacy
// reset is when the reported limit is full again.
func (p *policy) setHeaders(h http.Header, res fleetrate.Result) string {
	if qi, ok := p.reportedQuota(res); ok {
		return p.setQuotaHeaders(h, res, res.Quotas[qi])
	}
	i := p.limitIndex(res)
	l := p.limits[i]
	remaining := min(max(res.Remaining, 0), l.Burst)
	t := headers.EffectiveWindow(len(p.limits), remaining, res)
	if !res.Allowed {
		t = min(t, res.RetryAfter)
	}
	h.Set(HeaderRateLimitPolicy, p.header)
	if v, err := headers.FormatRateLimit(headers.Limit{Name: p.items[i], Remaining: remaining * p.upt, Reset: t, HasReset: true}); err == nil {
		h.Set(HeaderRateLimit, v)
	}
	if p.m.legacy {
		at := res.At
		if at.IsZero() {
			at = time.Now()
		}
		// The limit's debt is at most ResetAfter and at most what its
		// remaining tokens allow.
		full := min(res.ResetAfter, time.Duration(l.Burst-remaining)*time.Duration(l.Interval()))
		headers.SetLegacy(h, headers.Legacy{Limit: l.Burst * p.upt, Remaining: remaining * p.upt, Reset: at.Add(full)})
	}
	return p.items[i]
}

func (m *Middleware) storeFailed(w http.ResponseWriter, r *http.Request, p *policy, err error, next http.Handler) {
	m.metrics.storeError(p.name)
	closed := m.failClosed && !p.shadow
	outcome := OutcomeFailOpen
	if closed {
		outcome = OutcomeFailClosed
	}
	m.metrics.request(p.name, outcome)
	now := time.Now()
	m.mu.Lock()
	logIt, dropped := now.Sub(m.lastLog) >= storeErrorLogInterval, m.dropped
	if logIt {
		m.lastLog, m.dropped = now, 0
	} else {
		m.dropped++
	}
	m.mu.Unlock()
	if logIt {
		m.log.LogAttrs(r.Context(), slog.LevelError, "fleetrate: rate limit store failed",
			slog.String("policy", p.name), slog.String("outcome", outcome),
			slog.Any("error", err), slog.Int("suppressed", dropped))
	}
	if !closed {
		next.ServeHTTP(w, r)
		return
	}
	w.Header().Set(HeaderRetryAfter, "1")
	m.unavail(w, r, err)
}
