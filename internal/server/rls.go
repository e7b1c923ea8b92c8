package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// Names of the response headers added when Options.ResponseHeaders is set.
const (
	HeaderLimit     = "RateLimit-Limit"
	HeaderRemaining = "RateLimit-Remaining"
	HeaderReset     = "RateLimit-Reset"
)

// maxEntries bounds the entries of one descriptor.
const maxEntries = 32

// plan is what one descriptor of a request will do.
type plan struct {
	rule     *config.Rule
	limits   []fleetrate.Limit // token limits; nil when no store call is needed
	bucket   fleetrate.Bucket
	domain   string // metric label
	metric   string // metric label
	hits     int64  // tokens to take; 0 peeks
	tooMany  bool   // hits exceed a burst: can never be granted
	negative bool   // give hits back instead of taking them
	replaced bool
}

// outcome is what one descriptor did.
type outcome struct {
	status   *rlspb.RateLimitResponse_DescriptorStatus
	over     bool  // counts towards OVER_LIMIT
	consumed int64 // tokens taken, to give back if the request is denied
	result   string
	err      error
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", fleetrate.ErrInvalid, fmt.Sprintf(format, args...))
}

// shouldRateLimit decides a rate limit request. The error wraps
// fleetrate.ErrInvalid for a bad request, and is a store failure
// otherwise.
func (s *Server) shouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	st := s.state.Load()
	plans, err := s.plan(st, req)
	if err != nil {
		return nil, err
	}
	outs := make([]outcome, len(plans))
	var wg sync.WaitGroup
	for i := range plans {
		if plans[i].limits == nil || len(plans) == 1 {
			outs[i] = s.decide(ctx, &plans[i])
			continue
		}
		wg.Go(func() { outs[i] = s.decide(ctx, &plans[i]) })
	}
	wg.Wait()

	resp := &rlspb.RateLimitResponse{OverallCode: s.overall(plans, outs)}
	var failure error
	for _, o := range outs {
		if o.err != nil && failure == nil {
			failure = o.err
		}
		resp.Statuses = append(resp.Statuses, o.status)
	}
	if failure != nil || resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
		// The request will not go through: give back what it took, so that
		// a denial by one descriptor spends nothing from the others.
		s.giveBack(ctx, plans, outs)
	}
	for i, o := range outs {
		result := o.result
		if failure != nil {
			result = resultError
		}
		s.metrics.decisions.WithLabelValues(apiRLS, plans[i].domain, plans[i].metric, result).Inc()
	}
	if failure != nil {
		return nil, failure
	}
	if s.opts.ShadowMode {
		resp.OverallCode = rlspb.RateLimitResponse_OK
	}
	if s.opts.ResponseHeaders {
		resp.ResponseHeadersToAdd = rateLimitHeaders(resp.Statuses)
	}
	if s.opts.ResponseDynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, plans, outs)
	}
	return resp, nil
}

// overall decides the request from its descriptors' outcomes, as
// envoyproxy/ratelimit does: OVER_LIMIT when a descriptor that is not in
// quota mode is over its limit, or when every descriptor in quota mode is.
// A descriptor is in quota mode when its rule says quota_mode, or for every
// limited descriptor when Options.QuotaMode is set.
func (s *Server) overall(plans []plan, outs []outcome) rlspb.RateLimitResponse_Code {
	var over, quota, quotaOver int
	for i, o := range outs {
		r := plans[i].rule
		if r != nil && r.Unlimited {
			continue
		}
		inQuota := s.opts.QuotaMode || (r != nil && r.QuotaMode)
		if inQuota {
			quota++
		}
		switch {
		case o.over && inQuota:
			quotaOver++
		case o.over:
			over++
		}
	}
	if over > 0 || (quota > 0 && quotaOver == quota) {
		return rlspb.RateLimitResponse_OVER_LIMIT
	}
	return rlspb.RateLimitResponse_OK
}

// plan validates the request and resolves every descriptor to its rule.
func (s *Server) plan(st *state, req *rlspb.RateLimitRequest) ([]plan, error) {
	if req.GetDomain() == "" {
		return nil, invalidf("domain: must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, invalidf("descriptors: at least one descriptor is required")
	}
	if len(req.GetDescriptors()) > MaxDescriptors {
		return nil, invalidf("descriptors: at most %d descriptors, got %d", MaxDescriptors, len(req.GetDescriptors()))
	}
	dom := st.cfg.Domain(req.GetDomain())
	domainLabel := labelUnknown
	if dom != nil {
		domainLabel = dom.Name
	}
	// Envoy sends hits_addend 0 when it has nothing to say: one hit.
	hits := int64(max(req.GetHitsAddend(), 1))
	plans := make([]plan, len(req.GetDescriptors()))
	replaced := map[string]bool{}
	for i, d := range req.GetDescriptors() {
		field := fmt.Sprintf("descriptors[%d]", i)
		if d == nil || len(d.GetEntries()) == 0 {
			return nil, invalidf("%s.entries: at least one entry is required", field)
		}
		if len(d.GetEntries()) > maxEntries {
			return nil, invalidf("%s.entries: at most %d entries, got %d", field, maxEntries, len(d.GetEntries()))
		}
		entries := make([]config.Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			if e.GetKey() == "" {
				return nil, invalidf("%s.entries[%d].key: must not be empty", field, j)
			}
			entries[j] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		p := &plans[i]
		p.domain, p.hits, p.negative = domainLabel, hits, d.GetIsNegativeHits()
		if h := d.GetHitsAddend(); h != nil {
			// An explicit descriptor-level value wins; 0 peeks.
			p.hits = int64(min(h.GetValue(), fleetrate.MaxBurst+1))
		}
		m := dom.Match(entries)
		if ov := d.GetLimit(); ov != nil {
			spec, err := overrideSpec(ov, field+".limit")
			if err != nil {
				return nil, err
			}
			// An override that matches no rule is labelled by a fixed name:
			// its descriptor keys come from the client and would grow the
			// metrics without bound.
			id, metric := req.GetDomain()+"."+keysOf(entries), req.GetDomain()+"."+labelOverride
			if m.Rule != nil {
				id, metric = m.Rule.ID, m.Metric
			}
			m = config.Match{
				Rule:   &config.Rule{ID: id, Limits: []config.LimitSpec{spec}},
				Key:    config.DescriptorKey(req.GetDomain(), entries),
				Metric: metric,
			}
			if dom == nil {
				m.Metric = labelUnknown
			}
			if !spec.Denies() {
				p.limits = m.Rule.TokenLimits()
			}
		} else if m.Rule != nil && !m.Rule.Unlimited && !m.Rule.Denies() {
			p.limits = st.rules[m.Rule]
		}
		p.rule, p.metric = m.Rule, m.Metric
		if m.Rule == nil {
			p.metric = labelUnmatched
			continue
		}
		for _, name := range m.Rule.Replaces {
			replaced[name] = true
		}
		if p.limits != nil {
			p.bucket = fleetrate.Bucket{Prefix: s.opts.Prefix, Key: m.Key, Limits: p.limits}
			for _, l := range p.limits {
				if p.hits > l.Burst {
					p.tooMany = true
				}
			}
		}
	}
	for i := range plans {
		if r := plans[i].rule; r != nil && r.Name != "" && replaced[r.Name] {
			plans[i].replaced = true
		}
	}
	return plans, nil
}

func keysOf(entries []config.Entry) string {
	keys := make([]string, len(entries))
	for i, e := range entries {
		keys[i] = e.Key
	}
	return strings.Join(keys, ".")
}

// overrideSpec turns a descriptor's limit override into a limit with
// burst requests_per_unit.
func overrideSpec(ov *rlcommon.RateLimitDescriptor_RateLimitOverride, field string) (config.LimitSpec, error) {
	u := config.Unit(ov.GetUnit())
	if u < config.Second || u > config.Year {
		return config.LimitSpec{}, invalidf("%s.unit: unknown unit %s", field, ov.GetUnit())
	}
	spec := config.LimitSpec{RequestsPerUnit: ov.GetRequestsPerUnit(), Unit: u, UnitMultiplier: 1, Burst: int64(ov.GetRequestsPerUnit())}
	if m := ov.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return config.LimitSpec{}, invalidf("%s.unit_multiplier: must be at least 1", field)
		}
		spec.UnitMultiplier = m.GetValue()
	}
	if err := spec.Validate(); err != nil {
		return config.LimitSpec{}, invalidf("%s: %s: %v", field, spec, err)
	}
	return spec, nil
}

// decide applies one descriptor's plan.
func (s *Server) decide(ctx context.Context, p *plan) outcome {
	ok := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
	switch {
	case p.rule == nil:
		return outcome{status: ok, result: resultUnmatched}
	case p.replaced:
		return outcome{status: ok, result: "replaced"}
	case p.rule.Unlimited:
		ok.LimitRemaining = math.MaxUint32
		return outcome{status: ok, result: resultUnlimited}
	case p.limits == nil: // requests_per_unit 0: deny everything
		spec := p.rule.Limits[0]
		for _, l := range p.rule.Limits {
			if l.Denies() {
				spec = l
			}
		}
		st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OVER_LIMIT, CurrentLimit: currentLimit(spec)}
		return s.shadow(p, outcome{status: st, over: true, result: resultOverLimit})
	case p.tooMany && !p.negative:
		spec := p.rule.Limits[0]
		for _, l := range p.rule.Limits {
			if l.Burst < spec.Burst {
				spec = l
			}
		}
		st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OVER_LIMIT, CurrentLimit: currentLimit(spec)}
		return s.shadow(p, outcome{status: st, over: true, result: resultOverLimit})
	}
	sctx, cancel := s.storeCtx(ctx)
	defer cancel()
	if p.negative {
		if p.hits > 0 {
			if err := s.store.Refund(sctx, []fleetrate.Bucket{p.bucket}, min(p.hits, fleetrate.MaxBurst)); err != nil {
				return outcome{err: err}
			}
		}
		res, err := s.store.Take(sctx, fleetrate.Request{Buckets: []fleetrate.Bucket{p.bucket}})
		if err != nil {
			return outcome{err: err}
		}
		st := s.status(p, res)
		st.Code = rlspb.RateLimitResponse_OK
		return outcome{status: st, result: resultRefunded}
	}
	res, err := s.store.Take(sctx, fleetrate.Request{Buckets: []fleetrate.Bucket{p.bucket}, N: p.hits})
	if err != nil {
		return outcome{err: err}
	}
	st := s.status(p, res)
	allowed := res.Allowed
	if p.hits == 0 {
		// A peek asks whether one more hit would pass now.
		allowed = res.Allowed && res.Remaining >= 1
	}
	if allowed {
		o := outcome{status: st, result: resultAllowed}
		if p.hits > 0 {
			o.consumed = p.hits
		}
		return o
	}
	st.Code = rlspb.RateLimitResponse_OVER_LIMIT
	return s.shadow(p, outcome{status: st, over: true, result: resultOverLimit})
}

// shadow turns an over-limit outcome of a shadow_mode rule into OK.
func (s *Server) shadow(p *plan, o outcome) outcome {
	if p.rule.ShadowMode && o.over {
		o.over = false
		o.status.Code = rlspb.RateLimitResponse_OK
		o.result = resultShadow
	}
	return o
}

// status reports a store result as a descriptor status: the limit that
// decided, the tokens left, and the time until the request would pass
// (when over limit) or until the bucket is full again (when under).
func (s *Server) status(p *plan, res fleetrate.Result) *rlspb.RateLimitResponse_DescriptorStatus {
	spec := p.rule.Limits[0]
	for i, l := range p.limits {
		if l == res.Limit && i < len(p.rule.Limits) {
			spec = p.rule.Limits[i]
			break
		}
	}
	reset := res.ResetAfter
	if !res.Allowed {
		reset = res.RetryAfter
	}
	return &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               rlspb.RateLimitResponse_OK,
		CurrentLimit:       currentLimit(spec),
		LimitRemaining:     uint32(min(max(res.Remaining, 0), math.MaxUint32)),
		DurationUntilReset: durationpb.New(reset),
	}
}

func currentLimit(spec config.LimitSpec) *rlspb.RateLimitResponse_RateLimit {
	cl := &rlspb.RateLimitResponse_RateLimit{
		Name:            spec.Name,
		RequestsPerUnit: spec.RequestsPerUnit,
		Unit:            rlspb.RateLimitResponse_RateLimit_Unit(spec.Unit),
	}
	if spec.UnitMultiplier > 1 {
		cl.UnitMultiplier = wrapperspb.UInt32(spec.UnitMultiplier)
	}
	return cl
}

// giveBack refunds the tokens taken by the descriptors of a request that
// is denied or failed. It is best effort: a failure is logged only.
func (s *Server) giveBack(ctx context.Context, plans []plan, outs []outcome) {
	for i := range outs {
		n := outs[i].consumed
		if n == 0 {
			continue
		}
		rctx, cancel := s.storeCtx(context.WithoutCancel(ctx))
		err := s.store.Refund(rctx, []fleetrate.Bucket{plans[i].bucket}, n)
		cancel()
		if err != nil {
			s.log.Warn("refund of a denied request's tokens failed", "bucket", plans[i].bucket.StoreKey(), "n", n, "error", err.Error())
			continue
		}
		if st := outs[i].status; st != nil && st.CurrentLimit != nil && st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
			st.LimitRemaining = uint32(min(int64(st.LimitRemaining)+n, math.MaxUint32))
		}
	}
}

// rateLimitHeaders builds RateLimit-Limit, -Remaining and -Reset from the most
// restrictive status: an over-limit one if any, else the one with the
// fewest requests left.
func rateLimitHeaders(statuses []*rlspb.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var pick *rlspb.RateLimitResponse_DescriptorStatus
	for _, st := range statuses {
		if st == nil || st.CurrentLimit == nil {
			continue
		}
		switch {
		case pick == nil:
			pick = st
		case st.Code == rlspb.RateLimitResponse_OVER_LIMIT && pick.Code != rlspb.RateLimitResponse_OVER_LIMIT:
			pick = st
		case st.Code == pick.Code && st.LimitRemaining < pick.LimitRemaining:
			pick = st
		}
	}
	if pick == nil {
		return nil
	}
	secs := headers.DelaySeconds(pick.DurationUntilReset.AsDuration())
	return []*corev3.HeaderValue{
		{Key: HeaderLimit, Value: strconv.FormatUint(uint64(pick.CurrentLimit.RequestsPerUnit), 10)},
		{Key: HeaderRemaining, Value: strconv.FormatUint(uint64(pick.LimitRemaining), 10)},
		{Key: HeaderReset, Value: strconv.FormatInt(secs, 10)},
	}
}

// isInvalid reports whether err is a rejected request rather than a
// failure.
func isInvalid(err error) bool {
	return errors.Is(err, fleetrate.ErrInvalid) || errors.Is(err, fleetrate.ErrBurstExceeded)
}
