package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

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
	rule      *config.Rule
	limits    []fleetrate.Limit                    // token limits; nil when no store call is needed
	quotas    []fleetrate.Quota                    // the bucket's calendar quotas
	quotaSpec []int                                // for each quota, the index of the rule's limit it serves, or -1
	buckets   [1]fleetrate.Bucket                  // the bucket, as the store takes it (buckets[:]) with no copy
	lim       *fleetrate.Limiter                   // the rule's Limiter, nil for the store's Take
	current   []*rlspb.RateLimitResponse_RateLimit // the rule's limits as statuses report them, shared; nil to build them
	domain    string                               // metric label
	metric    string                               // metric label
	hits      int64                                // tokens to take; 0 peeks
	tooMany   bool                                 // hits exceed a burst: can never be granted
	negative  bool                                 // give hits back instead of taking them
	replaced  bool
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
	quota  bool // the status reports a calendar quota of the bucket
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
			if n := nearLimitHits(nearLimitOf(o), p.hits, s.opts.NearLimitRatio); n > 0 {
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
	if s.opts.LimitHeaders.Enabled {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, limitHeaders(s.opts.LimitHeaders, s.opts.QuotaMode, plans, outs)...)
	}
	if s.opts.ResponseDynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, plans, outs)
	}
	return resp, nil
}

// decideAll decides the descriptors of a request of several. Their
// takes go to the store together (fleetrate.TakeMany: one script call on
// Redis, most often), from this goroutine; the descriptors that give
// hits back, or peek at a bucket their hits exceed, call the store from
// goroutines of their own at the same time.
func (s *Server) decideAll(ctx context.Context, plans []plan) []outcome {
	outs := make([]outcome, len(plans))
	var takes []int // the plans that take from the store
	var wg sync.WaitGroup
	for i := range plans {
		switch p := &plans[i]; {
		case takesOnly(p):
			takes = append(takes, i)
		case p.limits == nil:
			s.decide(ctx, p, &outs[i]) // no store call
		default:
			wg.Go(func() { s.decide(ctx, p, &outs[i]) })
		}
	}
	switch len(takes) {
	case 0:
	case 1:
		s.decide(ctx, &plans[takes[0]], &outs[takes[0]])
	default:
		s.takeMany(ctx, plans, outs, takes)
	}
	wg.Wait()
	return outs
}

// takesOnly reports whether deciding p is one take from the store (or a
// peek), which decide would make through take.
func takesOnly(p *plan) bool {
	return p.limits != nil && p.rule != nil && !p.replaced && !p.rule.Unlimited && !p.tooMany && !p.negative
}

// takeMany decides the plans at idx, each of which takesOnly, with one
// call of the store's for them all: the outcome of plans[i] in outs[i].
func (s *Server) takeMany(ctx context.Context, plans []plan, outs []outcome, idx []int) {
	reqs, res, errs := make([]fleetrate.Request, len(idx)), make([]fleetrate.Result, len(idx)), make([]error, len(idx))
	for k, i := range idx {
		p := &plans[i]
		reqs[k] = fleetrate.Request{Buckets: p.buckets[:], N: p.hits}
	}
	sctx, cancel := s.storeCtx(ctx)
	_ = fleetrate.TakeMany(sctx, s.store, reqs, res, errs) // its own error is in every errs[k] too
	cancel()
	for k, i := range idx {
		o := &outs[i]
		if o.err = errs[k]; o.err == nil {
			o.res = res[k]
			s.settle(&plans[i], o)
		}
	}
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
	o.status, o.spec, o.idx, o.quota = s.status(p, &o.res)
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
	if p.hits == 0 && res.Allowed {
		quotaPeek(res)
	}
	o.status, o.spec, o.idx, o.quota = s.status(p, res)
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

// status reports a store result as an OK descriptor status (a calendar
// quota's when one decided: see quotaStatus, and quota is then set): the
// limit that decided, the tokens left, and the time until the request would pass
// (when over limit) or until the bucket is full again (when under), in
// whole seconds rounded up, since Envoy reads only the seconds.
func (s *Server) status(p *plan, res *fleetrate.Result) (st *rlspb.RateLimitResponse_DescriptorStatus, spec *config.LimitSpec, idx int, quota bool) {
	if qi, ok := quotaDecides(res); ok {
		st, spec, idx = s.quotaStatus(p, res, qi)
		return st, spec, idx, true
	}
	// The rule's own spec, which the configuration keeps unchanged: the
	// outcome points to it rather than to a copy of its own.
	idx = specIndex(p, &res.Limit)
	spec = &p.rule.Limits[idx]
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
	}, spec, idx, false
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
				o.status, o.spec, o.idx, o.quota = s.status(p, &after)
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

// isInvalid reports whether err is a rejected request rather than a
// failure.
func isInvalid(err error) bool {
	return errors.Is(err, fleetrate.ErrInvalid) || errors.Is(err, fleetrate.ErrBurstExceeded)
}
