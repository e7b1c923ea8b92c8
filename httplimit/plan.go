package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// This file is a policy's calendar quotas (Policy.Quotas), a plan such as
// "10,000 a month, resetting on the 1st": their validation, their items in
// the RateLimit-Policy field, and what the RateLimit fields say when a
// quota is the tighter of the policy's limits.
//
// The store enforces them with the policy's limits in one take
// (fleetrate.Config.Quotas) and reports each quota after the decision
// (fleetrate.Result.Quotas), so every number sent here is the store's: a
// quota's remaining is what its window has left, and its reset is the
// window's end on the store's clock.

// quotaItem returns the header item name of quota q of policy name.
func quotaItem(policy string, q fleetrate.Quota) string {
	if q.Name != "" {
		return policy + "." + q.Name
	}
	return policy + "." + q.Period.Unit.String()
}

// validateQuotas checks the policy's quotas, naming the offending field:
// each valid (a count of 1 or more, a valid period), named so that its
// header item is unique, and with Limits to smooth it.
func (p Policy) validateQuotas() error {
	if len(p.Quotas) == 0 {
		return nil
	}
	if len(p.Limits) == 0 {
		return fmt.Errorf("%w: httplimit: policy %q: quotas need limits beside them (the limits smooth the quota's use)", fleetrate.ErrInvalid, p.Name)
	}
	for i, q := range p.Quotas {
		if err := q.Validate(); err != nil {
			return fmt.Errorf("%w: httplimit: policy %q: quotas[%d]: %w", fleetrate.ErrInvalid, p.Name, i, err)
		}
		if q.Name != "" {
			if err := validName(fmt.Sprintf("quotas[%d].name", i), q.Name); err != nil {
				return fmt.Errorf("%w: httplimit: policy %q: %w", fleetrate.ErrInvalid, p.Name, err)
			}
		}
		if q.Count > headers.MaxInteger/max(p.UnitsPerToken, 1) {
			return fmt.Errorf("%w: httplimit: policy %q: quotas[%d].count %d times %d units per token exceeds the headers' largest integer %d",
				fleetrate.ErrInvalid, p.Name, i, q.Count, max(p.UnitsPerToken, 1), int64(headers.MaxInteger))
		}
		item := quotaItem(p.Name, q)
		for j, o := range p.Quotas[:i] {
			if quotaItem(p.Name, o) == item {
				return fmt.Errorf("%w: httplimit: policy %q: quotas[%d] and quotas[%d] are both named %q; give them distinct names", fleetrate.ErrInvalid, p.Name, j, i, item)
			}
		}
		for j, l := range p.Limits {
			if l.Name != "" && p.Name+"."+l.Name == item {
				return fmt.Errorf("%w: httplimit: policy %q: limits[%d] and quotas[%d] are both named %q", fleetrate.ErrInvalid, p.Name, j, i, item)
			}
		}
	}
	return nil
}

// advertiseQuotas adds the quotas' items to what the RateLimit-Policy
// field lists, in unit: "q" is the quota's count. There is no "w": a
// calendar window has no fixed length (a month is 28 to 31 days, a day 23
// to 25 hours where clocks change), and the draft's "w" promises one; the
// RateLimit field's "t" states when the current window ends. A request
// costing more than a quota's count is never admitted, as one above a
// burst.
func (pol *policy) advertiseQuotas(hp []headers.Policy, unit string) []headers.Policy {
	for _, q := range pol.cal {
		item := quotaItem(pol.name, q)
		pol.calItems = append(pol.calItems, item)
		if q.Count < pol.minBurst {
			pol.minBurst, pol.minItem = q.Count, item
		}
		hp = append(hp, headers.Policy{Name: item, Quota: q.Count * pol.upt, Unit: unit})
	}
	return hp
}

// reportedQuota returns the index in res.Quotas of the quota the RateLimit
// fields report, or false when they report a token-bucket limit: the
// quota that refused, or, for a grant, the quota with the fewest remaining
// when it has no more left than the tightest limit (on a tie the quota,
// whose promise lasts until its window ends). A refusal by a limit reports
// that limit.
func (p *policy) reportedQuota(res fleetrate.Result) (int, bool) {
	if len(res.Quotas) == 0 || res.Quota < 0 || res.Quota >= len(res.Quotas) {
		return 0, false
	}
	if res.QuotaDenied {
		i, _ := quotaWait(res)
		return i, true
	}
	if !res.Allowed {
		return 0, false
	}
	l := p.limits[p.limitIndex(res)]
	return res.Quota, res.Quotas[res.Quota].Remaining <= min(max(res.Remaining, 0), l.Burst)
}

// quotaWait returns, for a take refused by a quota, the index in
// res.Quotas of the refusing quota whose window ends last, and how long
// until then. The store names the first quota that refuses and waits for
// its window only; when several refuse, the take is admitted only once
// the last of their windows has ended.
func quotaWait(res fleetrate.Result) (int, time.Duration) {
	i := res.Quota
	for j, st := range res.Quotas {
		if st.Remaining < res.N && st.Reset.After(res.Quotas[i].Reset) {
			i = j
		}
	}
	return i, res.Quotas[i].Reset.Sub(res.At)
}

// retryAfter returns how long until the refused take res would be
// admitted: the store's RetryAfter, or longer when several quotas refuse
// (see quotaWait).
func retryAfter(res fleetrate.Result) time.Duration {
	if !res.QuotaDenied || res.Quota < 0 || res.Quota >= len(res.Quotas) {
		return res.RetryAfter
	}
	_, d := quotaWait(res)
	return max(res.RetryAfter, d)
}

// setQuotaHeaders sets the RateLimit fields (and the legacy ones) for a
// decision reported by quota st, and returns its item name. "r" is what
// the window has left; "t" is the time until the window ends, rounded
// down, within which no more than "r" is admitted. The legacy fields give
// the count, the remaining and the window's end, exact to the second.
func (p *policy) setQuotaHeaders(h http.Header, res fleetrate.Result, st fleetrate.QuotaStatus) string {
	item := quotaItem(p.name, st.Quota)
	at := res.At
	if at.IsZero() {
		at = time.Now()
	}
	t := max(st.Reset.Sub(at), 0).Truncate(time.Second)
	if !res.Allowed {
		t = min(t, retryAfter(res))
	}
	h.Set(HeaderRateLimitPolicy, p.header)
	if v, err := headers.FormatRateLimit(headers.Limit{Name: item, Remaining: st.Remaining * p.upt, Reset: t, HasReset: true}); err == nil {
		h.Set(HeaderRateLimit, v)
	}
	if p.m.legacy {
		headers.SetLegacy(h, headers.Legacy{Limit: st.Quota.Count * p.upt, Remaining: st.Remaining * p.upt, Reset: st.Reset})
	}
	return item
}

// quotaDetail explains a refusal by a quota in the problem's detail.
func (p *policy) quotaDetail(res fleetrate.Result, item string, retry int64) string {
	i, _ := quotaWait(res)
	st := res.Quotas[i]
	d := fmt.Sprintf("the quota of policy %q (%d %s per %s) is used up for this client until %s; retry in %d s",
		item, st.Quota.Count*p.upt, p.unit, st.Quota.Period, st.Reset.UTC().Format(time.RFC3339), retry)
	if res.N != 1 {
		d = fmt.Sprintf("this request costs %d %s; %s", res.N*p.upt, p.unit, d)
	}
	return d
}

// mountedShape describes a policy's limits and quotas, to tell whether
// two policies of one name enforce the same.
func mountedShape(limits []fleetrate.Limit, quotas []fleetrate.Quota) string {
	s := "limits"
	for _, l := range limits {
		s += fmt.Sprintf(" %q %s/s burst %d", l.Name, strconv.FormatFloat(l.Rate, 'g', -1, 64), l.Burst)
	}
	for _, q := range quotas {
		s += fmt.Sprintf(", quota %q %s", q.Name, q)
	}
	return s
}
