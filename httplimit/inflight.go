package httplimit

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/fleetrate/fleetrate"
)

// releaseTimeout bounds the release of a permit once the handler has
// returned, whatever the request's context says.
const releaseTimeout = time.Second

// serveInFlight is serve for a policy with an in-flight bound: the request
// takes its tokens and a permit of the client's bucket at once, the
// handler runs holding the permit, and the permit goes back when it
// returns (or at the end of its lease, should this process die first).
func (p *policy) serveInFlight(w http.ResponseWriter, r *http.Request, lim *fleetrate.Limiter, key string, cost int64, next http.Handler) {
	ctx, cancel := r.Context(), context.CancelFunc(func() {})
	if p.m.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, p.m.timeout)
	}
	start := time.Now()
	res, err := lim.AllowCosts(ctx, fleetrate.Cost{Bucket: bucketName(key), N: cost})
	cancel()
	p.m.metrics.observe(p.name, time.Since(start))
	if err != nil {
		if r.Context().Err() != nil {
			return // the client has gone; there is no one to answer
		}
		p.m.storeFailed(w, r, p, err, next)
		return
	}
	item := p.setHeaders(w.Header(), res.Result)
	if !res.Result.Allowed {
		if res.Result.InFlight.Bound > 0 && res.Result.InFlight.Held >= res.Result.InFlight.Bound {
			p.refuseInFlight(w, r, res.Result, next)
			return
		}
		p.refuse(w, r, res.Result, item, next)
		return
	}
	p.m.metrics.request(p.name, OutcomeAllowed)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), releaseTimeout)
		defer cancel()
		if err := res.Release(rctx); err != nil {
			p.m.log.LogAttrs(r.Context(), slog.LevelWarn, "fleetrate: in-flight permit not released", slog.String("policy", p.name), slog.Any("error", err))
		}
	}()
	next.ServeHTTP(w, r)
}

// refuseInFlight answers a request beyond the client's in-flight bound:
// 429 with the rate's RateLimit fields (set already) and no Retry-After,
// since no one knows when a request in flight ends.
func (p *policy) refuseInFlight(w http.ResponseWriter, r *http.Request, res fleetrate.Result, next http.Handler) {
	m := p.m
	item := p.name + ".in-flight"
	if p.shadow {
		m.metrics.request(p.name, OutcomeShadowDenied)
		m.log.LogAttrs(r.Context(), slog.LevelInfo, "fleetrate: shadow mode: request would be refused for the in-flight bound", slog.String("policy", item))
		next.ServeHTTP(w, r)
		return
	}
	m.metrics.request(p.name, OutcomeDenied)
	m.refused(w, r, Refusal{
		Status: http.StatusTooManyRequests, Policy: item, Cost: res.N * p.upt, Result: res,
		Problem: Problem{
			Type:             ProblemQuotaExceeded,
			Title:            "Too Many Requests In Flight",
			Detail:           fmt.Sprintf("this client has %d requests in flight, the most policy %q allows at once; retry when one ends", res.InFlight.Held, p.name),
			ViolatedPolicies: []string{item},
		},
	})
}
