package server

import (
	"strconv"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
)

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

// ruleLimits returns how the descriptors of rule r take: its bucket's
// limits and quotas (config.Rule.Enforced), the statuses' current
// limits, and a Limiter when one can take for it.
func (s *Server) ruleLimits(r *config.Rule) ruleLimits {
	e := r.Enforced(s.opts.FixedWindow)
	rl := ruleLimits{limits: e.Limits, quotas: e.Quotas, quotaSpec: e.QuotaSpec}
	for _, spec := range r.Limits {
		rl.current = append(rl.current, currentLimit(spec))
	}
	// A Limiter's default limits have no quotas: such a rule takes from
	// the store.
	if s.opts.LocalCacheBytes <= 0 && len(e.Quotas) == 0 {
		rl.lim, _ = fleetrate.New(s.opts.Store, fleetrate.Config{Prefix: s.opts.Prefix, Limits: rl.limits})
	}
	return rl
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
		if p.limits != nil && s.opts.FixedWindow {
			e := m.Rule.Enforced(true)
			p.limits, p.quotas, p.quotaSpec = e.Limits, e.Quotas, e.QuotaSpec
		}
	} else if m.Rule != nil && !m.Rule.Unlimited && !m.Rule.Denies() {
		rl := rp.st.rules[m.Rule]
		p.limits, p.lim, p.current = rl.limits, rl.lim, rl.current
		p.quotas, p.quotaSpec = rl.quotas, rl.quotaSpec
	}
	p.rule, p.metric = m.Rule, m.Metric
	if m.Rule == nil {
		p.metric = labelUnmatched
		return nil
	}
	if p.limits != nil {
		p.buckets[0] = fleetrate.Bucket{Prefix: s.opts.Prefix, Key: m.Key, Limits: p.limits, Quotas: p.quotas}
		for _, l := range p.limits {
			if p.hits > l.Burst {
				p.tooMany = true
			}
		}
		p.tooMany = p.tooMany || quotaTooMany(p.quotas, p.hits)
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
