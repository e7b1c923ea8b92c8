package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// Names of the response headers added when Options.ResponseHeaders is
// set: the fields of the IETF draft, as httplimit sends them.
const (
	HeaderRateLimitPolicy = headers.RateLimitPolicy
	HeaderRateLimit       = headers.RateLimit
)

// maxEntries bounds the entries of one descriptor.
const maxEntries = 32

// plan is what one descriptor of a request will do.
type plan struct {
	rule     *config.Rule
	limits   []fleetrate.Limit                    // token limits; nil when no store call is needed
	buckets  [1]fleetrate.Bucket                  // the bucket, as the store takes it (buckets[:]) with no copy
	lim      *fleetrate.Limiter                   // the rule's Limiter, nil for the store's Take
	current  []*rlspb.RateLimitResponse_RateLimit // the rule's limits as statuses report them, shared; nil to build them
	domain   string                               // metric label
	metric   string                               // metric label
	hits     int64                                // tokens to take; 0 peeks
	tooMany  bool                                 // hits exceed a burst: can never be granted
	negative bool                                 // give hits back instead of taking them
	replaced bool
}

// outcome is what one descriptor did.
type outcome struct {
	status   *rlspb.RateLimitResponse_DescriptorStatus
	over     bool  // counts towards OVER_LIMIT
	consumed int64 // tokens taken, to give back if the request is denied
	result   string
	err      error
	// spec is the limit status.current_limit reports, when it has one,
	// and idx its index in the rule's limits; res is the store's answer,
	// when the store was asked.
	spec   *config.LimitSpec
	idx    int
	res    fleetrate.Result
	hasRes bool
	// state is the bucket as the RateLimit field reports it, when it is
	// not res: for a cost above the burst, a peek that took nothing; for
	// tokens given back after a denial, a peek after the refund.
	state    fleetrate.Result
	hasState bool
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
	var one [1]outcome
	outs := one[:]
	if len(plans) == 1 {
		s.decide(ctx, &plans[0], &outs[0])
	} else {
		outs = s.decideAll(ctx, plans)
	}
	return s.respond(ctx, req, plans, outs)
}

// respond builds the response to a request from its descriptors'
// outcomes, gives back what a denied request took, and counts the
// decisions. It is apart from shouldRateLimit so that its locals are not
// on the stack while the store is called: a call's stack then seldom
// grows (which copies it) on the way to the store.
func (s *Server) respond(ctx context.Context, req *rlspb.RateLimitRequest, plans []plan, outs []outcome) (*rlspb.RateLimitResponse, error) {
	resp := &rlspb.RateLimitResponse{OverallCode: s.overall(plans, outs), Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, 0, len(outs))}
	var failure error
	for i := range outs {
		if o := &outs[i]; o.err != nil && failure == nil {
			failure = o.err
		}
	}
	if failure != nil || resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
		// The request will not go through: give back what it took, so that
		// a denial by one descriptor spends nothing from the others.
		s.giveBack(ctx, plans, outs, failure == nil)
	}
	for i := range outs {
		resp.Statuses = append(resp.Statuses, outs[i].status)
	}
	for i := range outs {
		o, p := &outs[i], &plans[i]
		result := o.result
		if failure != nil {
			result = resultError
		}
		s.metrics.decision(apiRLS, p.domain, p.metric, result)
		if failure == nil && o.hasRes && p.hits > 0 && !p.negative {
			if n := nearLimitHits(o.res, p.hits, s.opts.NearLimitRatio); n > 0 {
				s.metrics.nearLimit.WithLabelValues(p.domain, s.metrics.descriptor(p.metric)).Add(float64(n))
			}
		}
	}
	if failure != nil {
		return nil, failure
	}
	if s.opts.ShadowMode {
		resp.OverallCode = rlspb.RateLimitResponse_OK
	}
	if s.opts.ResponseHeaders {
		resp.ResponseHeadersToAdd = rateLimitHeaders(plans, outs)
	}
	if s.opts.ResponseDynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, plans, outs)
	}
	return resp, nil
}

// decideAll decides the descriptors of a request of several, those that
// call the store at the same time.
func (s *Server) decideAll(ctx context.Context, plans []plan) []outcome {
	outs := make([]outcome, len(plans))
	var wg sync.WaitGroup
	for i := range plans {
		if plans[i].limits == nil {
			s.decide(ctx, &plans[i], &outs[i])
			continue
		}
		wg.Go(func() { s.decide(ctx, &plans[i], &outs[i]) })
	}
	wg.Wait()
	return outs
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
	rp := requestPlan{st: st, req: req, dom: st.cfg.Domain(req.GetDomain()), domainLabel: labelUnknown}
	if rp.dom != nil {
		rp.domainLabel = rp.dom.Name
	}
	// Envoy sends hits_addend 0 when it has nothing to say: one hit.
	rp.hits = int64(max(req.GetHitsAddend(), 1))
	plans := make([]plan, len(req.GetDescriptors()))
	var replaced map[string]bool // the names of the rules the matched rules replace
	total := 0
	for i, d := range req.GetDescriptors() {
		entries, size, err := descriptorEntries(i, d)
		if err != nil {
			return nil, err
		}
		if total += size; total > MaxRequestKeyBytes {
			return nil, invalidf("descriptors: keys and values total more than %d bytes", MaxRequestKeyBytes)
		}
		if err := s.planDescriptor(&rp, i, d, entries, &plans[i]); err != nil {
			return nil, err
		}
		if r := plans[i].rule; r != nil && len(r.Replaces) > 0 {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			for _, name := range r.Replaces {
				replaced[name] = true
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

// requestPlan is what every descriptor of one request shares.
type requestPlan struct {
	st          *state
	req         *rlspb.RateLimitRequest
	dom         *config.Domain // nil when the config has no such domain
	domainLabel string
	hits        int64 // the request's hits_addend, at least 1
}

// descriptorField names descriptor i in an error.
func descriptorField(i int) string { return "descriptors[" + strconv.Itoa(i) + "]" }

// descriptorEntries checks descriptor i of a request and returns its
// entries and the bytes of their keys and values.
func descriptorEntries(i int, d *rlcommon.RateLimitDescriptor) ([]config.Entry, int, error) {
	if d == nil || len(d.GetEntries()) == 0 {
		return nil, 0, invalidf("%s.entries: at least one entry is required", descriptorField(i))
	}
	if len(d.GetEntries()) > maxEntries {
		return nil, 0, invalidf("%s.entries: at most %d entries, got %d", descriptorField(i), maxEntries, len(d.GetEntries()))
	}
	entries := make([]config.Entry, len(d.GetEntries()))
	size := 0
	for j, e := range d.GetEntries() {
		if e.GetKey() == "" {
			return nil, 0, invalidf("%s.entries[%d].key: must not be empty", descriptorField(i), j)
		}
		// Sizes bound the memory a hostile client can make the store
		// hold: every distinct descriptor is a bucket. The errors give
		// the size, never the bytes.
		if n := len(e.GetKey()); n > MaxEntryBytes {
			return nil, 0, invalidf("%s.entries[%d].key: %d bytes, at most %d", descriptorField(i), j, n, MaxEntryBytes)
		}
		if n := len(e.GetValue()); n > MaxEntryBytes {
			return nil, 0, invalidf("%s.entries[%d].value: %d bytes, at most %d", descriptorField(i), j, n, MaxEntryBytes)
		}
		size += len(e.GetKey()) + len(e.GetValue())
		entries[j] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	if size > MaxDescriptorBytes {
		return nil, 0, invalidf("%s.entries: keys and values total %d bytes, at most %d", descriptorField(i), size, MaxDescriptorBytes)
	}
	return entries, size, nil
}

// planDescriptor resolves descriptor i, of the given entries, to its rule
// and bucket in p.
func (s *Server) planDescriptor(rp *requestPlan, i int, d *rlcommon.RateLimitDescriptor, entries []config.Entry, p *plan) error {
	p.domain, p.hits, p.negative = rp.domainLabel, rp.hits, d.GetIsNegativeHits()
	if h := d.GetHitsAddend(); h != nil {
		// An explicit descriptor-level value wins; 0 peeks.
		p.hits = int64(min(h.GetValue(), fleetrate.MaxBurst+1))
	}
	m := rp.dom.Match(entries)
	if ov := d.GetLimit(); ov != nil {
		var err error
		if m, p.limits, err = overrideMatch(rp, i, ov, entries, m); err != nil {
			return err
		}
	} else if m.Rule != nil && !m.Rule.Unlimited && !m.Rule.Denies() {
		rl := rp.st.rules[m.Rule]
		p.limits, p.lim, p.current = rl.limits, rl.lim, rl.current
	}
	p.rule, p.metric = m.Rule, m.Metric
	if m.Rule == nil {
		p.metric = labelUnmatched
		return nil
	}
	if p.limits != nil {
		p.buckets[0] = fleetrate.Bucket{Prefix: s.opts.Prefix, Key: m.Key, Limits: p.limits}
		for _, l := range p.limits {
			if p.hits > l.Burst {
				p.tooMany = true
			}
		}
	}
	return nil
}

// overrideMatch is the match of descriptor i, whose entries matched m,
// under its limit override ov, and the override's token limits (nil when
// it denies everything).
func overrideMatch(rp *requestPlan, i int, ov *rlcommon.RateLimitDescriptor_RateLimitOverride, entries []config.Entry, m config.Match) (config.Match, []fleetrate.Limit, error) {
	domain := rp.req.GetDomain()
	spec, err := overrideSpec(ov, descriptorField(i)+".limit")
	if err != nil {
		return config.Match{}, nil, err
	}
	// An override that matches no rule is labelled by a fixed name: its
	// descriptor keys come from the client and would grow the metrics
	// without bound.
	id, metric := domain+"."+keysOf(entries), domain+"."+labelOverride
	if m.Rule != nil {
		id, metric = m.Rule.ID, m.Metric
	}
	m = config.Match{
		Rule:   &config.Rule{ID: id, Limits: []config.LimitSpec{spec}},
		Key:    config.DescriptorKey(domain, entries),
		Metric: metric,
	}
	if rp.dom == nil {
		m.Metric = labelUnknown
	}
	if spec.Denies() {
		return m, nil, nil
	}
	return m, m.Rule.TokenLimits(), nil
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

// decide applies one descriptor's plan, its outcome in *o (which is
// zero): the outcome is written in place rather than returned, so that
// the frames of a decision stay small and a call's stack seldom has to
// grow (copying it) on its way to the store.
func (s *Server) decide(ctx context.Context, p *plan, o *outcome) {
	switch {
	case p.rule == nil:
		*o = outcome{status: okStatus(), result: resultUnmatched}
		return
	case p.replaced:
		*o = outcome{status: okStatus(), result: "replaced"}
		return
	case p.rule.Unlimited:
		ok := okStatus()
		ok.LimitRemaining = math.MaxUint32
		*o = outcome{status: ok, result: resultUnlimited}
		return
	case p.limits == nil: // requests_per_unit 0: deny everything
		s.deniesAll(p, o)
		return
	case p.tooMany && !p.negative:
		s.exceedsBurst(ctx, p, o)
		return
	}
	sctx, cancel := s.storeCtx(ctx)
	if p.negative {
		s.giveHits(sctx, p, o)
	} else {
		s.take(sctx, p, o)
	}
	cancel()
	if o.err == nil && !p.negative {
		s.settle(p, o)
	}
}

func okStatus() *rlspb.RateLimitResponse_DescriptorStatus {
	return &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OK}
}

// deniesAll is the outcome of a rule with a limit of requests_per_unit 0.
func (s *Server) deniesAll(p *plan, o *outcome) {
	idx := 0
	for i, l := range p.rule.Limits {
		if l.Denies() {
			idx = i
		}
	}
	spec := &p.rule.Limits[idx]
	st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OVER_LIMIT, CurrentLimit: currentLimit(*spec),
		DurationUntilReset: durationpb.New(spec.Period())}
	*o = outcome{status: st, over: true, result: resultOverLimit, spec: spec, idx: idx}
	s.shadow(p, o)
}

// exceedsBurst is the outcome of hits that exceed a burst of the rule:
// never granted, reported against the smallest burst. Waiting cannot help,
// so the status has no duration_until_reset (as httplimit sends no
// Retry-After for such a request). With Options.ResponseHeaders the
// bucket is peeked, taking nothing, for the RateLimit field, as httplimit
// does; should the peek fail, the field says r=0 with no "t".
func (s *Server) exceedsBurst(ctx context.Context, p *plan, o *outcome) {
	idx := 0
	for i, l := range p.rule.Limits {
		if l.Burst < p.rule.Limits[idx].Burst {
			idx = i
		}
	}
	spec := &p.rule.Limits[idx]
	st := &rlspb.RateLimitResponse_DescriptorStatus{Code: rlspb.RateLimitResponse_OVER_LIMIT, CurrentLimit: currentLimit(*spec)}
	*o = outcome{status: st, over: true, result: resultOverLimit, spec: spec, idx: idx}
	if s.opts.ResponseHeaders {
		sctx, cancel := s.storeCtx(ctx)
		res, err := s.store.Take(sctx, fleetrate.Request{Buckets: p.buckets[:]})
		cancel()
		if err == nil {
			o.state, o.hasState = res, true
		}
	}
	s.shadow(p, o)
}

// giveHits gives a negative descriptor's hits back to its bucket, then
// peeks at it for the status.
func (s *Server) giveHits(ctx context.Context, p *plan, o *outcome) {
	if p.hits > 0 {
		// Envoy's negative hits do not say when the hits they return were
		// taken: they are given back as of now (docs/API.md says what a
		// late one costs).
		if err := s.store.Refund(ctx, p.buckets[:], min(p.hits, fleetrate.MaxBurst), s.opts.Clock()); err != nil {
			o.err = err
			return
		}
	}
	if o.res, o.err = s.store.Take(ctx, fleetrate.Request{Buckets: p.buckets[:]}); o.err != nil {
		o.res = fleetrate.Result{}
		return
	}
	o.hasRes, o.result = true, resultRefunded
	o.status, o.spec, o.idx = s.status(p, &o.res)
}

// take takes a descriptor's hits from its bucket (or, for 0 hits, peeks):
// the store's answer in o.res, or its error in o.err. It goes through the
// rule's Limiter when the key can name one of its buckets, and times the
// call as the store's own (instrumented) calls are timed.
func (s *Server) take(ctx context.Context, p *plan, o *outcome) {
	key := p.buckets[0].Key
	if p.lim == nil || key == "" || len(key) > fleetrate.MaxNameLen {
		s.takeStore(ctx, p, o)
		return
	}
	start := time.Now()
	o.res, o.err = p.lim.AllowN(ctx, p.hits, key)
	s.metrics.observe(storeOpTake, start, o.err)
	if o.err != nil {
		o.res = fleetrate.Result{}
	}
}

// takeStore is take through the store's Take.
func (s *Server) takeStore(ctx context.Context, p *plan, o *outcome) {
	if o.res, o.err = s.store.Take(ctx, fleetrate.Request{Buckets: p.buckets[:], N: p.hits}); o.err != nil {
		o.res = fleetrate.Result{}
	}
}

// settle makes the outcome of a take the store answered (o.res).
func (s *Server) settle(p *plan, o *outcome) {
	res := &o.res
	o.hasRes = true
	if p.hits == 0 && res.Allowed && res.Remaining < 1 {
		// A peek asks whether one more hit would pass now: it would after
		// the next token.
		res.Allowed, res.RetryAfter = false, max(res.RetryAfter, time.Duration(res.Limit.Interval())-res.ResetAfter%time.Duration(res.Limit.Interval()))
	}
	o.status, o.spec, o.idx = s.status(p, res)
	if res.Allowed {
		o.result = resultAllowed
		if p.hits > 0 {
			o.consumed = p.hits
		}
		return
	}
	o.over, o.result = true, resultOverLimit
	s.shadow(p, o)
}

// DefaultNearLimitRatio is the default of Options.NearLimitRatio, as
// envoyproxy/ratelimit's NEAR_LIMIT_RATIO.
const DefaultNearLimitRatio = 0.8

// nearLimitHits is envoyproxy/ratelimit's near_limit for one take of hits
// tokens decided by res, with a limit's "used" read as its burst less the
// tokens left: the tokens of the take that fall above ratio of the burst
// in use, and at most the burst. Its threshold is the burst times ratio,
// rounded down. A denial counts the tokens from where the bucket was (or
// the threshold) to the burst, as envoyproxy/ratelimit counts the hits
// below its limit of a request that went over it.
func nearLimitHits(res fleetrate.Result, hits int64, ratio float64) int64 {
	burst := res.Limit.Burst
	if burst <= 0 || hits <= 0 {
		return 0
	}
	near := int64(math.Floor(float64(burst) * ratio))
	used := burst - min(max(res.Remaining, 0), burst) // after a grant; unchanged by a denial
	if !res.Allowed {
		return max(burst-max(near, used), 0)
	}
	return max(used-max(near, used-hits), 0)
}

// overLimit makes st an OVER_LIMIT status as Envoy reads it: no requests
// left, and a duration_until_reset of whole seconds, rounded up and at
// least one. Envoy copies the seconds of duration_until_reset, truncated,
// into X-RateLimit-Reset, so that a sub-second wait would tell a client
// "0" on a 429. A status without duration_until_reset (a cost above the
// burst, which no wait admits) keeps none.
func overLimit(st *rlspb.RateLimitResponse_DescriptorStatus) {
	st.Code = rlspb.RateLimitResponse_OVER_LIMIT
	st.LimitRemaining = 0
	if st.DurationUntilReset == nil {
		return
	}
	secs := max(headers.DelaySeconds(st.GetDurationUntilReset().AsDuration()), 1)
	st.DurationUntilReset = seconds(secs)
}

// shadow turns an over-limit outcome of a shadow_mode rule into OK. Every
// over-limit outcome passes through it, so it also shapes the status as
// Envoy needs it.
func (s *Server) shadow(p *plan, o *outcome) {
	if o.over {
		overLimit(o.status)
	}
	if p.rule.ShadowMode && o.over {
		o.over = false
		o.status.Code = rlspb.RateLimitResponse_OK
		o.result = resultShadow
	}
}

// status reports a store result as an OK descriptor status: the limit
// that decided, the tokens left, and the time until the request would pass
// (when over limit) or until the bucket is full again (when under), in
// whole seconds rounded up, since Envoy reads only the seconds.
func (s *Server) status(p *plan, res *fleetrate.Result) (*rlspb.RateLimitResponse_DescriptorStatus, *config.LimitSpec, int) {
	// The rule's own spec, which the configuration keeps unchanged: the
	// outcome points to it rather than to a copy of its own.
	idx := specIndex(p, &res.Limit)
	spec := &p.rule.Limits[idx]
	reset := res.ResetAfter
	if !res.Allowed {
		reset = res.RetryAfter
	}
	var cl *rlspb.RateLimitResponse_RateLimit
	if idx < len(p.current) {
		cl = p.current[idx]
	} else {
		cl = currentLimit(*spec)
	}
	return &rlspb.RateLimitResponse_DescriptorStatus{
		Code:               rlspb.RateLimitResponse_OK,
		CurrentLimit:       cl,
		LimitRemaining:     uint32(min(max(res.Remaining, 0), math.MaxUint32)),
		DurationUntilReset: seconds(headers.DelaySeconds(reset)),
	}, spec, idx
}

// specIndex is the index in the rule's limits of the limit a store's
// result names, 0 if none.
func specIndex(p *plan, l *fleetrate.Limit) int {
	for i := range p.limits {
		if sameLimit(&p.limits[i], l) && i < len(p.rule.Limits) {
			return i
		}
	}
	return 0
}

// sharedSeconds are the durations of 0 to 60 whole seconds, which the
// statuses that report them share (a status's duration is replaced, never
// changed), so that a decision allocates none.
var sharedSeconds = func() (d [61]*durationpb.Duration) {
	for i := range d {
		d[i] = &durationpb.Duration{Seconds: int64(i)}
	}
	return d
}()

// seconds is a duration of secs whole seconds, shared when it can be.
func seconds(secs int64) *durationpb.Duration {
	if secs >= 0 && secs < int64(len(sharedSeconds)) {
		return sharedSeconds[secs]
	}
	return durationpb.New(time.Duration(secs) * time.Second)
}

// sameLimit reports whether a store's result names limit l: the same
// name, rate and burst (a bound taker may pass back its own copy).
func sameLimit(l, r *fleetrate.Limit) bool {
	return l.Name == r.Name && l.Rate == r.Rate && l.Burst == r.Burst
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
// is denied or failed. It is best effort: a failure is logged only. When
// report is set (a denial, which is answered) each refunded bucket is
// then peeked, so that its status reports the bucket after the refund:
// its tokens and its time until full. Should the peek fail, the status
// adds the tokens given back to those it reported.
func (s *Server) giveBack(ctx context.Context, plans []plan, outs []outcome, report bool) {
	for i := range outs {
		o, p := &outs[i], &plans[i]
		n := o.consumed
		if n == 0 {
			continue
		}
		rctx, cancel := s.storeCtx(context.WithoutCancel(ctx))
		err := s.store.Refund(rctx, p.buckets[:], n, o.res.At)
		if err != nil {
			cancel()
			s.log.Warn("refund of a denied request's tokens failed", "bucket", p.buckets[0].StoreKey(), "n", n, "error", err.Error())
			continue
		}
		if report {
			after, err := s.store.Take(rctx, fleetrate.Request{Buckets: p.buckets[:]})
			if err == nil {
				cancel()
				code := o.status.GetCode()
				o.status, o.spec, o.idx = s.status(p, &after)
				o.status.Code = code
				o.state, o.hasState = after, true
				continue
			}
			s.log.Warn("peek after a refund failed", "bucket", p.buckets[0].StoreKey(), "error", err.Error())
		}
		cancel()
		if st := o.status; st != nil && st.CurrentLimit != nil && st.Code != rlspb.RateLimitResponse_OVER_LIMIT {
			st.LimitRemaining = uint32(min(int64(st.LimitRemaining)+n, math.MaxUint32))
		}
	}
}

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

// isInvalid reports whether err is a rejected request rather than a
// failure.
func isInvalid(err error) bool {
	return errors.Is(err, fleetrate.ErrInvalid) || errors.Is(err, fleetrate.ErrBurstExceeded)
}
