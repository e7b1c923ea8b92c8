package httplimit

import (
	"fmt"
	"net/http"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// Policy is a set of limits applied to the requests of a route (or of
// any handler it wraps), each client drawing from its own bucket.
type Policy struct {
	// Name identifies the policy in store keys, headers, logs and metrics:
	// 1 to 64 bytes of [A-Za-z0-9._-]. Routes mounted with policies of the
	// same name share their buckets, so they must have the same limits.
	// Required.
	Name string
	// Limits are enforced together: a request is admitted only when every
	// limit has tokens for it, e.g. 10/s with burst 20 and 10000/day. When
	// there are several, each needs a distinct Name, and the header items
	// are named "policy.limit"; a single unnamed limit is named after the
	// policy. Required.
	Limits []fleetrate.Limit
	// Quotas are calendar quotas enforced with Limits, in the same take,
	// on each client's own use: a plan such as 10,000 a month resetting on
	// the 1st, which Limits smooth over the minute (see fleetrate.Quota).
	// Their header items are named "policy.quota", after the quota's Name
	// or, without one, its period's unit ("policy.month"). The package
	// doc says what the headers report of them. Optional.
	Quotas []fleetrate.Quota
	// QuotaZone names the time zone of a request's client, for the quotas
	// (of the policy and of its tiers) whose period has no Location: a
	// name as calendar.Parse reads it, such as "Asia/Tokyo" or
	// "UTC+05:30", typically from the customer's account. Each client's
	// day then starts at its own midnight. "" leaves those quotas in UTC;
	// an error, or a zone that is unknown, answers the request through
	// Config.KeyError. A client whose zone changes starts a fresh window.
	// At most MaxQuotaZones zones per policy. Optional.
	QuotaZone func(*http.Request) (string, error)
	// Key identifies the client; the default is Config.Key.
	Key KeyFunc
	// Cost is the number of tokens a request takes; the default is 1.
	// See Weight and BodySize.
	Cost CostFunc
	// Unit is the quota unit advertised in RateLimit-Policy ("qu"), for
	// example "content-bytes" with a BodySize cost. Empty means requests.
	// A request whose cost exceeds the burst of a "content-bytes" policy
	// is answered 413 Content Too Large; of any other, 429.
	Unit string
	// UnitsPerToken is how many quota units one token stands for in the
	// headers: with Cost BodySize(1024, max) and Unit "content-bytes" it
	// must be 1024, so that "q" and "r" count bytes, not KiB. The default
	// is 1. It must be at most MaxUnitsPerToken.
	UnitsPerToken int64
	// Shadow puts this policy in shadow mode; see Config.Shadow.
	Shadow bool
	// Tiers are named alternatives to Limits, such as a free plan at 10/s
	// and a paid one at 100/s; Tier picks one per request. A tier is served
	// as a policy of its own named "policy.tier" (1 to 64 bytes in all): its
	// own buckets, header items and metrics label, so the buckets of
	// different tiers never mix. Limits, when given, is the default tier,
	// used when Tier returns "".
	Tiers []Tier
	// Tier names the tier of a request, typically from the caller's
	// identity in the context. Required with Tiers. An error, or a name
	// that is not one of Tiers (or "" without Limits), answers the request
	// through Config.KeyError.
	Tier func(*http.Request) (string, error)
	// InFlight, when above 0, bounds how many requests of one client may
	// be in flight at once across the fleet, beside the limits: a request
	// takes a permit with its tokens, all or nothing, holds it while the
	// handler runs and gives it back when the handler returns. A request
	// beyond the bound is answered 429 without Retry-After (no one knows
	// when a request in flight ends). At most fleetrate.MaxInFlight.
	InFlight int64
}

// Tier is one named set of limits of a Policy.
type Tier struct {
	// Name identifies the tier: 1 to 64 bytes of [A-Za-z0-9._-]. Required.
	Name string
	// Limits are the tier's limits, as Policy.Limits. Required.
	Limits []fleetrate.Limit
	// Quotas are the tier's calendar quotas, as Policy.Quotas: a plan.
	Quotas []fleetrate.Quota
}

// Validate checks the policy, naming the offending field and value.
func (p Policy) Validate() error {
	if err := validName("name", p.Name); err != nil {
		return fmt.Errorf("%w: httplimit: policy: %w", fleetrate.ErrInvalid, err)
	}
	if len(p.Tiers) > 0 || p.Tier != nil {
		if err := p.validateTiers(); err != nil {
			return err
		}
		if len(p.Limits) == 0 {
			return p.validateQuotas()
		}
	}
	if len(p.Limits) == 0 {
		return fmt.Errorf("%w: httplimit: policy %q: at least one limit is required", fleetrate.ErrInvalid, p.Name)
	}
	for i, l := range p.Limits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("%w: httplimit: policy %q: limits[%d]: %w", fleetrate.ErrInvalid, p.Name, i, err)
		}
		if len(p.Limits) == 1 && l.Name == "" {
			continue
		}
		if err := validName(fmt.Sprintf("limits[%d].name", i), l.Name); err != nil {
			return fmt.Errorf("%w: httplimit: policy %q with several limits: %w", fleetrate.ErrInvalid, p.Name, err)
		}
		for j, o := range p.Limits[:i] {
			if o.Name == l.Name {
				return fmt.Errorf("%w: httplimit: policy %q: limits[%d] and limits[%d] are both named %q", fleetrate.ErrInvalid, p.Name, j, i, l.Name)
			}
		}
	}
	if p.InFlight < 0 || p.InFlight > fleetrate.MaxInFlight {
		return fmt.Errorf("%w: httplimit: policy %q: in flight must be between 1 and %d (0: no bound), got %d",
			fleetrate.ErrInvalid, p.Name, fleetrate.MaxInFlight, p.InFlight)
	}
	if p.UnitsPerToken < 0 || p.UnitsPerToken > MaxUnitsPerToken {
		return fmt.Errorf("%w: httplimit: policy %q: units per token must be between 1 and %d (0 means 1), got %d",
			fleetrate.ErrInvalid, p.Name, MaxUnitsPerToken, p.UnitsPerToken)
	}
	switch p.Unit {
	case "", headers.UnitRequests, headers.UnitContentBytes, headers.UnitConcurrentRequests:
	default:
		return fmt.Errorf("%w: httplimit: policy %q: unit must be %q, %q or %q, got %q", fleetrate.ErrInvalid, p.Name,
			headers.UnitRequests, headers.UnitContentBytes, headers.UnitConcurrentRequests, p.Unit)
	}
	return p.validateQuotas()
}

func (p Policy) validateTiers() error {
	if p.Tier == nil || len(p.Tiers) == 0 {
		return fmt.Errorf("%w: httplimit: policy %q: tiers and a tier function go together", fleetrate.ErrInvalid, p.Name)
	}
	for i, t := range p.Tiers {
		if err := validName(fmt.Sprintf("tiers[%d].name", i), t.Name); err != nil {
			return fmt.Errorf("%w: httplimit: policy %q: %w", fleetrate.ErrInvalid, p.Name, err)
		}
		for j, o := range p.Tiers[:i] {
			if o.Name == t.Name {
				return fmt.Errorf("%w: httplimit: policy %q: tiers[%d] and tiers[%d] are both named %q", fleetrate.ErrInvalid, p.Name, j, i, t.Name)
			}
		}
		if err := p.tier(t).Validate(); err != nil {
			return fmt.Errorf("httplimit: policy %q: tiers[%d]: %w", p.Name, i, err)
		}
	}
	return nil
}

// tier returns the policy that serves tier t of p.
func (p Policy) tier(t Tier) Policy {
	p.Name, p.Limits, p.Quotas, p.Tiers, p.Tier = p.Name+"."+t.Name, t.Limits, t.Quotas, nil, nil
	return p
}

func validName(field, s string) error {
	if s == "" || len(s) > MaxPolicyNameLen {
		return fmt.Errorf("%s must be 1 to %d bytes, got %q", field, MaxPolicyNameLen, s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%s %q: byte %q is not one of [A-Za-z0-9._-]", field, s, c)
		}
	}
	return nil
}
