package server

import (
	"slices"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// rateLimitHeaders builds the IETF draft's RateLimit-Policy and RateLimit
// fields with the numbers httplimit sends for the same buckets (see
// docs/HEADERS.md).
//
// RateLimit-Policy lists every limit of every rule the request's
// descriptors matched, in request order and each rule's order: "q" and
// "w" as headers.QuotaWindow computes them (q=0 and w the period for a
// limit of requests_per_unit 0). It depends on the rules only, so a
// request of the same descriptors gets the same field on every response.
//
// RateLimit gives one item, the most restrictive limit: an over-limit
// descriptor's if any, else the one with the fewest tokens left. "r" is
// the tokens its limit holds and "t" the effective window
// (headers.EffectiveWindow, rounded down), which for a refusal never ends
// after the refusal's wait. A limit of requests_per_unit 0 reports r=0 and
// its period; a cost above the burst whose peek failed, r=0 and no "t".
func rateLimitHeaders(plans []plan, outs []outcome) []*corev3.HeaderValue {
	var (
		items []policyItem
		pick  headers.Limit
		found bool
		over  bool
	)
	for i := range outs {
		o, p := &outs[i], &plans[i]
		if o.spec == nil || o.status == nil || p.rule == nil {
			continue
		}
		names := make([]string, len(p.rule.Limits))
		for j, spec := range p.rule.Limits {
			items, names[j] = addPolicyItem(items, spec)
		}
		l := headers.Limit{Name: names[o.idx]}
		switch res, ok := reported(p, o); {
		case o.quota && o.status.DurationUntilReset != nil:
			// A calendar quota: what its window has left, until it ends.
			l.Remaining = int64(o.status.LimitRemaining)
			l.Reset, l.HasReset = o.status.DurationUntilReset.AsDuration(), true
		case ok:
			idx := specIndex(p, &res.Limit)
			l.Name = names[idx]
			l.Remaining = min(max(res.Remaining, 0), res.Limit.Burst)
			l.Reset, l.HasReset = headers.EffectiveWindow(len(p.limits), l.Remaining, res), true
			if !res.Allowed {
				l.Reset = min(l.Reset, res.RetryAfter)
			}
		case o.status.DurationUntilReset != nil:
			l.Reset, l.HasReset = o.status.DurationUntilReset.AsDuration(), true
		}
		if !found || (o.over && !over) || (o.over == over && l.Remaining < pick.Remaining) {
			pick, found, over = l, true, o.over
		}
	}
	if !found {
		return nil
	}
	ps := make([]headers.Policy, len(items))
	for i, it := range items {
		ps[i] = it.Policy
	}
	policy, err := headers.FormatPolicy(ps...)
	if err != nil {
		return nil
	}
	limit, err := headers.FormatRateLimit(pick)
	if err != nil {
		return nil
	}
	return []*corev3.HeaderValue{{Key: HeaderRateLimitPolicy, Value: policy}, {Key: HeaderRateLimit, Value: limit}}
}

// reported is the state of an outcome's bucket that the RateLimit field
// reports, if the store was asked: after a refund or a peek for the
// headers, that state, else the store's answer to the descriptor.
func reported(p *plan, o *outcome) (fleetrate.Result, bool) {
	switch {
	case p.limits == nil:
		return fleetrate.Result{}, false
	case o.hasState:
		return o.state, true
	case o.hasRes:
		res := o.res
		if p.hits == 0 && !p.negative {
			res.Allowed = true // settle marks an empty bucket's peek as a denial
		}
		return res, true
	}
	return fleetrate.Result{}, false
}

// policyItem is one item of RateLimit-Policy, with the limit it describes.
type policyItem struct {
	headers.Policy
	spec config.LimitSpec
}

// addPolicyItem adds the item of spec to items, unless it is there, and
// returns items and the item's name. The name is the limit's configured
// name when it is printable ASCII, else a description such as
// "100/minute". Items name distinct limits: a limit whose name another
// limit of the request already has is named "name (100/minute)", or
// "name (100/minute) 2" and so on.
func addPolicyItem(items []policyItem, spec config.LimitSpec) ([]policyItem, string) {
	base := policyName(spec)
	name := base
	for n := 1; ; n++ {
		k := slices.IndexFunc(items, func(it policyItem) bool { return it.Name == name })
		if k < 0 {
			break
		}
		if items[k].spec == spec {
			return items, name
		}
		desc := spec
		desc.Name = ""
		name = base + " (" + desc.String() + ")"
		if n > 1 {
			name += " " + strconv.Itoa(n)
		}
	}
	it := policyItem{Policy: headers.Policy{Name: name}, spec: spec}
	if spec.Denies() {
		it.Window = spec.Period()
	} else {
		l := spec.Limit()
		q, w := headers.QuotaWindow(l.Interval(), l.Burst)
		it.Quota, it.Window = q, time.Duration(w)*time.Second
	}
	return append(items, it), name
}

// policyName names a limit in the RateLimit fields: its configured name
// when it is printable ASCII, else a description such as "100/minute".
func policyName(spec config.LimitSpec) string {
	if spec.Name != "" && headers.ValidString(spec.Name) == nil {
		return spec.Name
	}
	spec.Name = ""
	return spec.String()
}
