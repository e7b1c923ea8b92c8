package httplimit

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetrate/fleetrate"
)

// UsageReport is the body of a UsageHandler's answer: where the calling
// client stands under a policy. Counts are in the policy's quota units
// (requests unless Policy.Unit says otherwise) and times are RFC 3339 in
// UTC, on the store's clock.
type UsageReport struct {
	// Policy is the name of the policy, "policy.tier" for a tier.
	Policy string `json:"policy"`
	// Unit is the quota unit of every count: "requests" unless the
	// policy says otherwise.
	Unit string `json:"unit"`
	// At is when the store read the usage.
	At time.Time `json:"at"`
	// Available is how much the client may use at once now: the fewest of
	// the limit's remaining and every quota's.
	Available int64 `json:"available"`
	// Limit is the policy's token-bucket limit with the fewest units left.
	Limit UsageLimit `json:"limit"`
	// Quotas are the policy's calendar quotas, in the order of
	// Policy.Quotas; empty without.
	Quotas []UsageQuota `json:"quotas"`
}

// UsageLimit is where a token-bucket limit of a policy stands.
type UsageLimit struct {
	// Name is the limit's header item name, as in the RateLimit fields.
	Name string `json:"name"`
	// Burst is the most the limit holds.
	Burst int64 `json:"burst"`
	// Used is what the limit misses of its burst now; Remaining what it
	// holds (Burst less Used).
	Used      int64 `json:"used"`
	Remaining int64 `json:"remaining"`
	// Reset is when every limit of the policy is full again: At when
	// they already are.
	Reset time.Time `json:"reset"`
}

// UsageQuota is where a calendar quota of a policy stands in its current
// window.
type UsageQuota struct {
	// Name is the quota's header item name, as in the RateLimit fields.
	Name string `json:"name"`
	// Period is the quota's calendar period, as calendar.Parse reads it,
	// such as "month day=1 Europe/Paris".
	Period string `json:"period"`
	// Count is what each window admits; Used what the current one has
	// used, and Remaining what it has left (Count less Used, at least 0).
	Count     int64 `json:"count"`
	Used      int64 `json:"used"`
	Remaining int64 `json:"remaining"`
	// Reset is when the current window ends and the quota is whole again.
	Reset time.Time `json:"reset"`
}

// UsageHandler returns a handler that answers GET (and HEAD) with the
// calling client's usage of policy p, for a customer's "my usage" page:
// mount it beside the routes p protects, e.g. at GET /v1/usage. It
// identifies the client as p does (p.Key, else Config.Key; for a policy
// with tiers, p.Tier picks the tier) and reads the usage with one store
// call that takes nothing (fleetrate.Limiter.Usage). p must be the policy
// given to Limit (or one with the same name, limits and quotas); an error
// names what is wrong with it.
//
// The answer is 200 with a UsageReport as application/json, such as
//
//	{
//	  "policy": "api.pro",
//	  "unit": "requests",
//	  "at": "2026-03-14T09:30:00.25Z",
//	  "available": 17,
//	  "limit": {"name": "api.pro.minute", "burst": 20, "used": 3, "remaining": 17,
//	            "reset": "2026-03-14T09:30:09.25Z"},
//	  "quotas": [{"name": "api.pro.month", "period": "month", "count": 10000,
//	              "used": 4711, "remaining": 5289, "reset": "2026-04-01T00:00:00Z"}]
//	}
//
// A client that never called gets its whole allowance: each remaining
// equal to its burst or count, "used" 0. A request whose client cannot be
// identified is answered as the middleware answers it (Config.KeyError);
// a store failure is answered 503 Service Unavailable with Retry-After: 1
// and a problem+json body, never with a made-up usage; any other method
// 405.
func (m *Middleware) UsageHandler(p Policy) (http.Handler, error) {
	if len(p.Tiers) > 0 || p.Tier != nil {
		t, err := m.compileTiers(p)
		if err != nil {
			return nil, err
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			pol, err := t.choose(r)
			if err != nil {
				m.keyError(w, r, err)
				return
			}
			pol.serveUsage(w, r)
		}), nil
	}
	pol, err := m.compile(p)
	if err != nil {
		return nil, err
	}
	return http.HandlerFunc(pol.serveUsage), nil
}

// serveUsage answers a usage request for the policy.
func (p *policy) serveUsage(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeProblem(w, http.StatusMethodNotAllowed, &Problem{
			Title:  http.StatusText(http.StatusMethodNotAllowed),
			Detail: "the usage of a client is read with GET",
		})
		return
	}
	key, err := p.key(r)
	if err == nil && key == "" {
		err = fmt.Errorf("%w: the key function returned an empty key", ErrNoKey)
	}
	var lim *fleetrate.Limiter
	if err == nil {
		lim, err = p.limiter(r)
	}
	if err != nil {
		p.m.keyError(w, r, err)
		return
	}
	ctx, cancel := r.Context(), context.CancelFunc(func() {})
	if p.m.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, p.m.timeout)
	}
	start := time.Now()
	u, err := lim.Usage(ctx, bucketName(key))
	cancel()
	p.m.metrics.observe(p.name, time.Since(start))
	if err != nil {
		p.m.metrics.storeError(p.name)
		p.m.log.LogAttrs(r.Context(), slog.LevelError, "fleetrate: rate limit store failed reading a client's usage",
			slog.String("policy", p.name), slog.Any("error", err))
		w.Header().Set(HeaderRetryAfter, "1")
		writeProblem(w, http.StatusServiceUnavailable, &Problem{
			Title:  http.StatusText(http.StatusServiceUnavailable),
			Detail: "the rate limiter is unavailable, so the usage cannot be read; retry shortly",
		})
		return
	}
	body, err := json.Marshal(p.report(u))
	if err != nil { // cannot happen: the report holds only numbers, strings and times
		writeProblem(w, http.StatusInternalServerError, &Problem{Title: http.StatusText(http.StatusInternalServerError), Detail: err.Error()})
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(body, '\n'))
}

// report turns a bucket's usage into the policy's UsageReport, in quota
// units.
func (p *policy) report(u fleetrate.Usage) UsageReport {
	i := 0
	for j, l := range p.limits {
		if l.Name == u.Limit.Name {
			i = j
			break
		}
	}
	l := p.limits[i]
	remaining := min(max(u.Remaining, 0), l.Burst)
	rep := UsageReport{
		Policy:    p.name,
		Unit:      p.unit,
		At:        u.At.UTC(),
		Available: max(u.Available(), 0) * p.upt,
		Limit: UsageLimit{
			Name: p.items[i], Burst: l.Burst * p.upt,
			Used: (l.Burst - remaining) * p.upt, Remaining: remaining * p.upt,
			Reset: latest(u.Full, u.At).UTC(),
		},
		Quotas: make([]UsageQuota, 0, len(u.Quotas)),
	}
	for _, st := range u.Quotas {
		rep.Quotas = append(rep.Quotas, UsageQuota{
			Name: quotaItem(p.name, st.Quota), Period: st.Quota.Period.String(),
			Count: st.Quota.Count * p.upt, Used: st.Used * p.upt, Remaining: st.Remaining * p.upt,
			Reset: st.Reset.UTC(),
		})
	}
	return rep
}

// latest returns the later of a and b.
func latest(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}
