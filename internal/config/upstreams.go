package config

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport"
)

// Upstream is one entry of the upstreams section: an upstream API whose
// requests workers in any language book and report through the service's
// outbound API, paced by the same transport as a Go worker's.
type Upstream struct {
	transport.Upstream
	// MaxAttempts is how many times a rate-limited request is sent in
	// all (the transport's Options.MaxAttempts); 0 means its default.
	MaxAttempts int
	File        string
	Line        int
}

// MaxUpstreamAttempts bounds an upstream's max_attempts.
const MaxUpstreamAttempts = 100

// headerForms names the rate-limit header forms as the file gives them.
var headerForms = map[string]transport.HeaderForm{
	"draft":       transport.HeadersDraft,
	"anthropic":   transport.HeadersAnthropic,
	"openai":      transport.HeadersOpenAI,
	"x-ratelimit": transport.HeadersXRateLimit,
}

// upstreams parses the upstreams list into cfg.
func (p *parser) upstreams(n *yaml.Node, cfg *Config) {
	for i, item := range p.sequence(n, "upstreams") {
		f := fmt.Sprintf("upstreams[%d]", i)
		u, ok := p.upstream(item, f)
		if !ok {
			continue
		}
		if err := u.Validate(); err != nil {
			p.errorf(item, f, "%v", err)
			continue
		}
		if _, err := u.Classifier(); err != nil {
			p.errorf(item, f, "%v", err)
			continue
		}
		for _, o := range cfg.Upstreams {
			if o.Channel == u.Channel {
				p.errorf(item, join(f, "channel"), "duplicate upstream %q (first on %s)", u.Channel, p.where(o.File, o.Line))
				ok = false
			}
		}
		if ok {
			cfg.Upstreams = append(cfg.Upstreams, u)
		}
	}
}

// upstreamChannels fails an upstream whose channel a bucket of the buckets
// section uses too: both would keep state under the same store keys with
// different limits.
func (p *parser) upstreamChannels(cfg *Config) {
	for _, u := range cfg.Upstreams {
		for _, b := range cfg.Buckets {
			if b.Channel == u.Channel {
				p.errs = append(p.errs, Problem{File: u.File, Line: u.Line,
					Msg: fmt.Sprintf("upstreams: channel %q is also a channel of the buckets section (%s): give each its own channel", u.Channel, p.where(b.File, b.Line))})
				return
			}
		}
	}
}

// upstream parses one entry of the upstreams list.
//
// It is long because each field of the entry gets its own case.
func (p *parser) upstream(item *yaml.Node, f string) (Upstream, bool) {
	pairs, ok := p.mapping(item, f, "channel", "credential", "drain_credential", "fixed", "credential_in_flight",
		"priorities", "meters", "headers", "max_attempts", "endpoints")
	if !ok {
		return Upstream{}, false
	}
	u := Upstream{File: p.file, Line: p.deref(item).Line}
	for _, kv := range pairs {
		field := join(f, kv.key)
		switch kv.key {
		case "channel":
			u.Channel, ok = p.str(kv.val, field)
		case "credential":
			u.Credential, ok = p.limitsOf(kv.val, field)
		case "drain_credential":
			u.DrainCredential, ok = p.boolean(kv.val, field)
		case "fixed":
			u.Fixed, ok = p.boolean(kv.val, field)
		case "credential_in_flight":
			u.CredentialInFlight, ok = p.integer(kv.val, field, 0, fleetrate.MaxInFlight)
		case "priorities":
			u.Priorities, ok = p.priorities(kv.val, field)
		case "meters":
			u.Meters, ok = p.meters(kv.val, field)
		case "headers":
			u.Headers, ok = p.headers(kv.val, field)
		case "max_attempts":
			var n int64
			n, ok = p.integer(kv.val, field, 1, MaxUpstreamAttempts)
			u.MaxAttempts = int(n)
		case "endpoints":
			u.Endpoints, ok = p.endpoints(kv.val, field)
		}
		if !ok {
			return Upstream{}, false
		}
	}
	return u, true
}

// limitsOf parses a mapping holding rate_limit or rate_limits into token
// bucket limits.
func (p *parser) limitsOf(n *yaml.Node, f string) ([]fleetrate.Limit, bool) {
	pairs, ok := p.mapping(n, f, "rate_limit", "rate_limits")
	if !ok {
		return nil, false
	}
	var rl, rls *yaml.Node
	for _, kv := range pairs {
		if kv.key == "rate_limit" {
			rl = kv.val
		} else {
			rls = kv.val
		}
	}
	return p.tokenLimits(p.deref(n), f, rl, rls)
}

// tokenLimits parses rate_limit or rate_limits into limits that admit
// requests: at least one, none denying.
func (p *parser) tokenLimits(at *yaml.Node, f string, rl, rls *yaml.Node) ([]fleetrate.Limit, bool) {
	r := &Rule{}
	switch {
	case !p.limits(at, f, rl, rls, r, false):
		return nil, false
	case len(r.Limits) == 0:
		p.errorf(at, f, "needs rate_limit or rate_limits with at least one limit")
		return nil, false
	case r.Denies():
		p.errorf(at, f, "requests_per_unit 0 is not allowed on an upstream")
		return nil, false
	}
	return r.TokenLimits(), true
}

// endpoints parses an upstream's endpoints.
//
// It is long because each field of an endpoint gets its own case.
func (p *parser) endpoints(n *yaml.Node, field string) ([]transport.Endpoint, bool) {
	var out []transport.Endpoint
	for i, item := range p.sequence(n, field) {
		f := fmt.Sprintf("%s[%d]", field, i)
		pairs, ok := p.mapping(item, f, "name", "pattern", "rate_limit", "rate_limits", "cost", "spacing", "priority", "in_flight", "costs")
		if !ok {
			return nil, false
		}
		var e transport.Endpoint
		var rl, rls *yaml.Node
		for _, kv := range pairs {
			ff := join(f, kv.key)
			switch kv.key {
			case "name":
				e.Name, ok = p.str(kv.val, ff)
			case "pattern":
				e.Pattern, ok = p.str(kv.val, ff)
			case "rate_limit":
				rl = kv.val
			case "rate_limits":
				rls = kv.val
			case "cost":
				e.Cost, ok = p.integer(kv.val, ff, 1, fleetrate.MaxBurst)
			case "spacing":
				e.Spacing, ok = p.duration(kv.val, ff)
			case "priority":
				e.Priority, ok = p.str(kv.val, ff)
			case "in_flight":
				e.InFlight, ok = p.integer(kv.val, ff, 1, fleetrate.MaxInFlight)
			case "costs":
				e.Costs, ok = p.costs(kv.val, ff)
			}
			if !ok {
				return nil, false
			}
		}
		if e.Limits, ok = p.tokenLimits(p.deref(item), f, rl, rls); !ok {
			return nil, false
		}
		out = append(out, e)
	}
	return out, true
}

// costs parses a mapping of meter names to costs.
func (p *parser) costs(n *yaml.Node, f string) (map[string]int64, bool) {
	n = p.deref(n)
	if n == nil || n.Kind != yaml.MappingNode {
		p.errorf(n, f, "must be a mapping of meter names to costs, such as {tokens: 1200}")
		return nil, false
	}
	out := make(map[string]int64, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := p.deref(n.Content[i])
		if k == nil || k.Kind != yaml.ScalarNode {
			p.errorf(n.Content[i], f, "keys must be plain strings")
			return nil, false
		}
		if _, dup := out[k.Value]; dup {
			p.errorf(k, join(f, k.Value), "given twice")
			return nil, false
		}
		v, ok := p.integer(n.Content[i+1], join(f, k.Value), 0, fleetrate.MaxBurst)
		if !ok {
			return nil, false
		}
		out[k.Value] = v
	}
	return out, true
}

// meters parses an upstream's meters.
func (p *parser) meters(n *yaml.Node, field string) ([]transport.Meter, bool) {
	var out []transport.Meter
	for i, item := range p.sequence(n, field) {
		f := fmt.Sprintf("%s[%d]", field, i)
		pairs, ok := p.mapping(item, f, "name", "rate_limit", "rate_limits")
		if !ok {
			return nil, false
		}
		var m transport.Meter
		var rl, rls *yaml.Node
		for _, kv := range pairs {
			switch kv.key {
			case "name":
				if m.Name, ok = p.str(kv.val, join(f, "name")); !ok {
					return nil, false
				}
			case "rate_limit":
				rl = kv.val
			case "rate_limits":
				rls = kv.val
			}
		}
		if m.Limits, ok = p.tokenLimits(p.deref(item), f, rl, rls); !ok {
			return nil, false
		}
		out = append(out, m)
	}
	return out, true
}

// priorities parses an upstream's priority classes.
func (p *parser) priorities(n *yaml.Node, field string) ([]fleetrate.Priority, bool) {
	var out []fleetrate.Priority
	for i, item := range p.sequence(n, field) {
		f := fmt.Sprintf("%s[%d]", field, i)
		pairs, ok := p.mapping(item, f, "name", "reserve", "horizon", "in_flight_reserve")
		if !ok {
			return nil, false
		}
		var pr fleetrate.Priority
		for _, kv := range pairs {
			ff := join(f, kv.key)
			switch kv.key {
			case "name":
				pr.Name, ok = p.str(kv.val, ff)
			case "reserve":
				pr.Reserve, ok = p.integer(kv.val, ff, 0, fleetrate.MaxBurst)
			case "horizon":
				pr.Horizon, ok = p.duration(kv.val, ff)
			case "in_flight_reserve":
				pr.InFlightReserve, ok = p.integer(kv.val, ff, 0, fleetrate.MaxInFlight)
			}
			if !ok {
				return nil, false
			}
		}
		out = append(out, pr)
	}
	return out, true
}

// headers parses how an upstream's rate-limit fields are read.
func (p *parser) headers(n *yaml.Node, f string) (transport.RateLimitHeaders, bool) {
	var h transport.RateLimitHeaders
	pairs, ok := p.mapping(n, f, "off", "forms", "window")
	if !ok {
		return h, false
	}
	for _, kv := range pairs {
		ff := join(f, kv.key)
		switch kv.key {
		case "off":
			h.Off, ok = p.boolean(kv.val, ff)
		case "window":
			h.Window, ok = p.duration(kv.val, ff)
		case "forms":
			for j, fn := range p.sequence(kv.val, ff) {
				name, sok := p.str(fn, fmt.Sprintf("%s[%d]", ff, j))
				form, known := headerForms[name]
				if sok && !known {
					p.errorf(fn, fmt.Sprintf("%s[%d]", ff, j), "unknown form %q (draft, anthropic, openai or x-ratelimit)", name)
				}
				if !sok || !known {
					return h, false
				}
				h.Forms |= form
			}
		}
		if !ok {
			return h, false
		}
	}
	return h, true
}
