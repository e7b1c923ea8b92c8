package httplimit

import (
	"fmt"
	"net/http"
)

// tiered serves a policy with tiers: each request by the policy of its
// tier.
type tiered struct {
	m     *Middleware
	name  string
	pick  func(*http.Request) (string, error)
	tiers map[string]*policy
	def   *policy // the policy's own Limits; nil without
}

func (m *Middleware) compileTiers(p Policy) (*tiered, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	t := &tiered{m: m, name: p.Name, pick: p.Tier, tiers: make(map[string]*policy, len(p.Tiers))}
	for _, tr := range p.Tiers {
		pol, err := m.compile(p.tier(tr))
		if err != nil {
			return nil, err
		}
		t.tiers[tr.Name] = pol
	}
	if len(p.Limits) > 0 {
		def := p
		def.Tiers, def.Tier = nil, nil
		pol, err := m.compile(def)
		if err != nil {
			return nil, err
		}
		t.def = pol
	}
	return t, nil
}

func (t *tiered) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	pol, err := t.choose(r)
	if err != nil {
		t.m.metrics.request(t.name, OutcomeNoKey)
		t.m.keyError(w, r, err)
		return
	}
	pol.serve(w, r, next)
}

// choose returns the policy of the request's tier.
func (t *tiered) choose(r *http.Request) (*policy, error) {
	name, err := t.pick(r)
	pol := t.def
	if err == nil && name != "" {
		pol = t.tiers[name]
	}
	if err == nil && pol == nil {
		err = fmt.Errorf("%w: policy %q has no tier %q", ErrNoKey, t.name, name)
	}
	if err != nil {
		return nil, fmt.Errorf("choosing the tier: %w", err)
	}
	return pol, nil
}
