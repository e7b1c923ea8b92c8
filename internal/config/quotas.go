package config

import (
	"fmt"
	"math"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
)

// This file reads the calendar quotas of a descriptor or a bucket
// (quotas: [{count: 10000, period: "month day=1 Europe/Paris"}]) and
// serves envoyproxy/ratelimit's fixed windows as calendar quotas (see
// Rule.Enforced).

// quotas parses a quotas list at field. Each entry gives count (1 to
// fleetrate.MaxQuotaCount), period (as calendar.Parse reads it) and an
// optional name; no period twice.
func (p *parser) quotas(n *yaml.Node, field string) ([]fleetrate.Quota, bool) {
	var out []fleetrate.Quota
	good := true
	first := map[string]int{} // a period's key: the entry that gave it first
	for i, item := range p.sequence(n, field) {
		f := fmt.Sprintf("%s[%d]", field, i)
		q, ok := p.quota(item, f)
		if !ok {
			good = false
			continue
		}
		if j, dup := first[q.Key()]; dup {
			p.errorf(p.deref(item), join(f, "period"), "period %q appears twice (first in %s[%d]): one quota per period", q.Key(), field, j)
			good = false
			continue
		}
		first[q.Key()] = i
		out = append(out, q)
	}
	if good && len(out) == 0 {
		p.errorf(n, field, "must list at least one quota, or be left out")
		return nil, false
	}
	return out, good
}

// quota parses one entry of a quotas list.
func (p *parser) quota(item *yaml.Node, f string) (fleetrate.Quota, bool) {
	pairs, good := p.mapping(item, f, "count", "period", "name")
	var (
		q                  fleetrate.Quota
		hasCount, hasRange bool
	)
	for _, kv := range pairs {
		vf := join(f, kv.key)
		var ok bool
		switch kv.key {
		case "count":
			q.Count, ok = p.integer(kv.val, vf, 1, fleetrate.MaxQuotaCount)
			hasCount = true
		case "period":
			var s string
			if s, ok = p.str(kv.val, vf); ok {
				var err error
				if q.Period, err = calendar.Parse(s); err != nil {
					p.errorf(kv.val, vf, "%q: %v", s, err)
					ok = false
				}
				hasRange = true
			}
		case "name":
			q.Name, ok = p.str(kv.val, vf)
		}
		good = good && ok
	}
	at := p.deref(item)
	if good && !hasCount {
		p.errorf(at, join(f, "count"), "is required (how many each window admits, 1 to %d)", int64(fleetrate.MaxQuotaCount))
		good = false
	}
	if good && !hasRange {
		p.errorf(at, join(f, "period"), `is required, e.g. "month day=1 Europe/Paris", "day Asia/Tokyo", "hour UTC+05:30"`)
		good = false
	}
	if good {
		if err := q.Validate(); err != nil {
			p.errorf(at, f, "%v", err)
			good = false
		}
	}
	return q, good
}

// FixedWindow returns the calendar period in UTC of
// envoyproxy/ratelimit's fixed window for the limit, which resets at
// multiples of the unit since the Unix epoch: a minute, an hour or a day
// at the UTC boundary, a week at Thursday 00:00 UTC (the epoch's
// weekday). ok is false for a limit no calendar period matches: a second,
// envoyproxy/ratelimit's 30-day month and 365-day year, and any
// unit_multiplier above 1.
func (l LimitSpec) FixedWindow() (p calendar.Period, ok bool) {
	if l.UnitMultiplier > 1 || l.Denies() {
		return calendar.Period{}, false
	}
	switch l.Unit {
	case Minute:
		return calendar.Period{Unit: calendar.Minute}, true
	case Hour:
		return calendar.Period{Unit: calendar.Hour}, true
	case Day:
		return calendar.Period{Unit: calendar.Day}, true
	case Week:
		return calendar.Period{Unit: calendar.Week, Weekday: time.Thursday}, true
	}
	return calendar.Period{}, false
}

// Enforcement is how the bucket of a rule enforces its limits and quotas.
type Enforcement struct {
	// Limits are the token-bucket limits, one for each of Rule.Limits, in
	// its order. A limit served as a fixed window is a pass-through limit
	// (PassThrough) that never decides.
	Limits []fleetrate.Limit
	// Quotas are the rule's quotas: the fixed windows first, then the
	// file's quotas.
	Quotas []fleetrate.Quota
	// QuotaSpec is, for each of Quotas, the index in Rule.Limits of the
	// limit it serves as a fixed window, or -1 for a quota of the file.
	QuotaSpec []int
}

// PassThrough returns the token-bucket limit that stands for a limit
// served as a calendar quota: a bucket needs a token limit, and this one
// admits everything a quota of at most math.MaxUint32 a window lets
// through (its burst, 2^40, holds many windows' worth; it refills a
// billion a second).
func PassThrough(name string) fleetrate.Limit {
	return fleetrate.Limit{Name: name, Rate: fleetrate.MaxRate, Burst: fleetrate.MaxBurst}
}

// Enforced returns how the rule's bucket enforces it. With fixedWindow,
// each limit whose FixedWindow exists is served as a calendar quota of
// requests_per_unit in that window, as envoyproxy/ratelimit's fixed
// window resets; a limit whose period a quota of the file, or an earlier
// limit of the rule, already has stays a token bucket (one quota per
// period). It must not be called on an unlimited or denying rule.
func (r *Rule) Enforced(fixedWindow bool) Enforcement {
	e := Enforcement{Limits: r.TokenLimits()}
	seen := map[string]bool{}
	for _, q := range r.Quotas {
		seen[q.Key()] = true
	}
	for i, l := range r.Limits {
		period, ok := l.FixedWindow()
		if !fixedWindow || !ok || seen[period.String()] {
			continue
		}
		seen[period.String()] = true
		e.Limits[i] = PassThrough(e.Limits[i].Name)
		e.Quotas = append(e.Quotas, fleetrate.Quota{Name: e.Limits[i].Name, Count: int64(l.RequestsPerUnit), Period: period})
		e.QuotaSpec = append(e.QuotaSpec, i)
	}
	for _, q := range r.Quotas {
		e.Quotas = append(e.Quotas, q)
		e.QuotaSpec = append(e.QuotaSpec, -1)
	}
	return e
}

// quotaUnits are the units of a status's current_limit for a quota's
// period.
var quotaUnits = map[calendar.Unit]Unit{calendar.Minute: Minute, calendar.Hour: Hour, calendar.Day: Day, calendar.Week: Week, calendar.Month: Month, calendar.Year: Year}

// QuotaSpec returns the quota as a limit of envoyproxy/ratelimit's form,
// for a status's current_limit: count (capped at math.MaxUint32) per the
// period's unit. It enforces nothing.
func QuotaSpec(q fleetrate.Quota) LimitSpec {
	n := uint32(min(q.Count, math.MaxUint32))
	return LimitSpec{Name: q.Name, RequestsPerUnit: n, Unit: quotaUnits[q.Period.Unit], UnitMultiplier: 1, Burst: int64(n)}
}

// IsPassThrough reports whether l is a PassThrough limit, which stands
// for a limit served as a calendar quota and decides nothing.
func IsPassThrough(l fleetrate.Limit) bool {
	return l.Rate == fleetrate.MaxRate && l.Burst == fleetrate.MaxBurst
}
