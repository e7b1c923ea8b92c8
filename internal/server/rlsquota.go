package server

import (
	"math"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// This file reports the calendar quotas of an RLS rule (its quotas, and
// its limits served as fixed windows with Options.FixedWindow) in a
// descriptor's status.

// quotaDecides returns the index in res.Quotas of the quota a status
// reports, if one does: the quota that refused the take, or for a grant
// the quota with the fewest remaining when it has no more than the
// tightest token limit. A denial by a token limit reports that limit.
func quotaDecides(res *fleetrate.Result) (int, bool) {
	if len(res.Quotas) == 0 || res.Quota < 0 || res.Quota >= len(res.Quotas) {
		return 0, false
	}
	switch {
	case res.QuotaDenied:
		return res.Quota, true
	case !res.Allowed:
		return 0, false
	}
	return res.Quota, res.Quotas[res.Quota].Remaining <= res.Remaining
}

// quotaPeek makes a peek (0 hits) of a bucket whose quota has nothing
// left a denial until the quota's window ends: one more hit would not
// pass before.
func quotaPeek(res *fleetrate.Result) {
	for i, q := range res.Quotas {
		if q.Remaining < 1 {
			res.Allowed, res.QuotaDenied, res.Quota = false, true, i
			res.RetryAfter = max(res.RetryAfter, q.Reset.Sub(res.At))
			return
		}
	}
}

// quotaStatus reports quota qi of res as a descriptor status: its count
// per its period as current_limit (the rule's limit, for a limit served
// as a fixed window), what the window has left, and the time until the
// window ends, when it is whole again, in whole seconds rounded up. It
// returns the spec current_limit states and its index in the rule's
// limits (0 for a quota of the file).
func (s *Server) quotaStatus(p *plan, res *fleetrate.Result, qi int) (*rlspb.RateLimitResponse_DescriptorStatus, *config.LimitSpec, int) {
	q := res.Quotas[qi]
	var (
		spec *config.LimitSpec
		cl   *rlspb.RateLimitResponse_RateLimit
		idx  int
	)
	if k := quotaIndex(p, q.Quota); k >= 0 && k < len(p.quotaSpec) && p.quotaSpec[k] >= 0 && p.quotaSpec[k] < len(p.rule.Limits) {
		idx = p.quotaSpec[k]
		spec = &p.rule.Limits[idx]
		if idx < len(p.current) {
			cl = p.current[idx]
		}
	} else {
		qs := config.QuotaSpec(q.Quota)
		spec = &qs
	}
	if cl == nil {
		cl = currentLimit(*spec)
	}
	reset := max(q.Reset.Sub(res.At), 0)
	if !res.Allowed {
		reset = max(reset, res.RetryAfter)
	}
	return &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               rlspb.RateLimitResponse_OK,
		CurrentLimit:       cl,
		LimitRemaining:     uint32(min(max(q.Remaining, 0), math.MaxUint32)),
		DurationUntilReset: seconds(headers.DelaySeconds(reset)),
	}, spec, idx
}

// quotaIndex is the index in the plan's quotas of q, by its period (one
// quota per period), or -1.
func quotaIndex(p *plan, q fleetrate.Quota) int {
	for i := range p.quotas {
		if p.quotas[i].Key() == q.Key() {
			return i
		}
	}
	return -1
}

// quotaTooMany reports whether hits exceed a quota's count: never granted
// in any window.
func quotaTooMany(quotas []fleetrate.Quota, hits int64) bool {
	for _, q := range quotas {
		if hits > q.Count {
			return true
		}
	}
	return false
}

// nearLimitOf is the result nearLimitHits reads for an outcome the store
// answered: when a quota decided its status, the quota as a limit of
// burst count with its remaining (a fixed window's near limit, as
// envoyproxy/ratelimit counts it); else the store's answer.
func nearLimitOf(o *outcome) fleetrate.Result {
	if !o.quota || o.res.Quota < 0 || o.res.Quota >= len(o.res.Quotas) {
		return o.res
	}
	q := o.res.Quotas[o.res.Quota]
	return fleetrate.Result{Allowed: o.res.Allowed, Remaining: q.Remaining, Limit: fleetrate.Limit{Burst: q.Quota.Count}}
}
