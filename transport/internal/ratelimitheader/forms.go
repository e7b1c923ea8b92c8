package ratelimitheader

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate/internal/headers"
)

// This file reads each form into a parse.

// parseCount reads a count: ASCII digits, at most 18 of them (surrounding
// spaces allowed). A limit must be positive.
func parseCount(v string, limit bool) (int64, Reason) {
	v = strings.TrimSpace(v)
	if strings.HasPrefix(v, "-") && digits(v[1:]) {
		return 0, Negative
	}
	if !digits(v) || len(v) > 18 {
		return 0, Garbage
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, Garbage
	}
	if limit && n == 0 {
		return 0, Negative
	}
	return n, ""
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseSeconds reads non-negative seconds with an optional fraction
// ("30", "1.5"), at most 12 digits before the point.
func parseSeconds(v string) (float64, Reason) {
	v = strings.TrimSpace(v)
	whole, frac, _ := strings.Cut(v, ".")
	if strings.HasPrefix(whole, "-") && digits(whole[1:]) {
		return 0, Negative
	}
	if !digits(whole) || len(whole) > 12 || frac != "" && (!digits(frac) || len(frac) > 9) || strings.HasSuffix(v, ".") {
		return 0, Garbage
	}
	s, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsInf(s, 0) || math.IsNaN(s) {
		return 0, Garbage
	}
	return s, ""
}

// unixThreshold is where a reset in seconds turns from a delay into a
// Unix time: 1e9 s is 2001-09-09 as a time and 31 years as a delay.
const unixThreshold = 1e9

// xReset reads a reset in seconds: a delay, or from unixThreshold up a
// Unix time (see the package doc).
func (p *parse) xReset(field string) (time.Duration, bool) {
	v, ok := p.value(field)
	if !ok {
		return 0, false
	}
	s, why := parseSeconds(v)
	if why != "" {
		p.ignore(field, v, why)
		return 0, false
	}
	var d time.Duration
	if s >= unixThreshold {
		sec, frac := math.Modf(s)
		d = time.Unix(int64(sec), int64(frac*1e9)).Sub(p.now)
	} else {
		d = time.Duration(s * float64(time.Second))
	}
	return p.resetIn(field, v, d)
}

// deltaReset reads a reset in delta-seconds only (the draft's).
func (p *parse) deltaReset(field string) (time.Duration, bool) {
	v, ok := p.value(field)
	if !ok {
		return 0, false
	}
	s, why := parseSeconds(v)
	if why == "" && s >= unixThreshold {
		why = TooFar
	}
	if why != "" {
		p.ignore(field, v, why)
		return 0, false
	}
	return p.resetIn(field, v, time.Duration(s*float64(time.Second)))
}

// xRateLimit reads X-RateLimit-Limit, -Remaining and -Reset.
func (p *parse) xRateLimit() {
	fields := [3]string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	lim, hasLim := p.count(fields[0], true)
	rem, hasRem := p.count(fields[1], false)
	reset, hasReset := p.xReset(fields[2])
	p.check(&p.out.Requests, values{lim, rem, reset, hasLim, hasRem, hasReset}, fields)
}

// openai reads x-ratelimit-{limit,remaining,reset}-{requests,tokens}.
func (p *parse) openai() {
	for _, dim := range []struct {
		name string
		q    *Quota
	}{{"requests", &p.out.Requests}, {"tokens", &p.out.Tokens}} {
		fields := [3]string{"x-ratelimit-limit-" + dim.name, "x-ratelimit-remaining-" + dim.name, "x-ratelimit-reset-" + dim.name}
		lim, hasLim := p.count(fields[0], true)
		rem, hasRem := p.count(fields[1], false)
		reset, hasReset := p.goReset(fields[2])
		p.check(dim.q, values{lim, rem, reset, hasLim, hasRem, hasReset}, fields)
		if dim.q.Limit > 0 {
			dim.q.Window = time.Minute
		}
	}
}

// goReset reads a reset as a Go-style duration ("6m0s", "20ms").
func (p *parse) goReset(field string) (time.Duration, bool) {
	v, ok := p.value(field)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		p.ignore(field, v, Garbage)
		return 0, false
	}
	if d < 0 {
		p.ignore(field, v, Negative)
		return 0, false
	}
	return p.resetIn(field, v, d)
}

// anthropic reads anthropic-ratelimit-*-{limit,remaining,reset}.
func (p *parse) anthropic() {
	read := func(dim string) Quota {
		var q Quota
		fields := [3]string{"anthropic-ratelimit-" + dim + "-limit", "anthropic-ratelimit-" + dim + "-remaining", "anthropic-ratelimit-" + dim + "-reset"}
		lim, hasLim := p.count(fields[0], true)
		rem, hasRem := p.count(fields[1], false)
		reset, hasReset := p.timeReset(fields[2])
		p.check(&q, values{lim, rem, reset, hasLim, hasRem, hasReset}, fields)
		if q.Limit > 0 {
			q.Window = time.Minute
		}
		return q
	}
	p.out.Requests = read("requests")
	p.out.Tokens = read("tokens")
	in, out := read("input-tokens"), read("output-tokens")
	if !p.out.Tokens.Stated() {
		p.out.Tokens = tighter(in, out)
	}
}

// tighter returns the quota with fewer remaining (a stated one over one
// that says nothing).
func tighter(a, b Quota) Quota {
	switch {
	case !b.Stated() || a.Reset > 0 && b.Reset > 0 && a.Remaining <= b.Remaining:
		return a
	case !a.Stated() || b.Reset > 0:
		return b
	}
	return a
}

// timeReset reads a reset as an RFC 3339 time.
func (p *parse) timeReset(field string) (time.Duration, bool) {
	v, ok := p.value(field)
	if !ok {
		return 0, false
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(v))
	if err != nil {
		p.ignore(field, v, Garbage)
		return 0, false
	}
	return p.resetIn(field, v, t.Sub(p.now))
}

// draft reads the IETF draft's fields, current or older (see the package
// doc).
func (p *parse) draft() {
	_, hasRL := p.h[http.CanonicalHeaderKey("RateLimit")]
	_, hasPol := p.h[http.CanonicalHeaderKey("RateLimit-Policy")]
	if !hasRL && !hasPol {
		p.draftFields()
		return
	}
	p.present = true
	if hasRL {
		if v := strings.Join(p.h.Values("RateLimit"), ", "); looksDictionary(v) {
			p.draftDictionary(v)
			return
		}
	}
	policies := p.policies()
	if !hasRL {
		if pol, ok := lowestRate(policies); ok {
			p.out.Requests.Limit, p.out.Requests.Window = pol.q, pol.w
		}
		return
	}
	p.draftItems(policies)
}

// looksDictionary reports whether a RateLimit value is the older
// Dictionary form: it starts with one of its keys and an "=".
func looksDictionary(v string) bool {
	v = strings.TrimSpace(v)
	for _, k := range []string{"limit=", "remaining=", "reset="} {
		if strings.HasPrefix(v, k) {
			return true
		}
	}
	return false
}

// draftDictionary reads `limit=100, remaining=50, reset=30`.
func (p *parse) draftDictionary(v string) {
	vals := map[string]string{}
	for part := range strings.SplitSeq(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			p.ignore("RateLimit", v, Garbage)
			return
		}
		val, _, _ = strings.Cut(val, ";") // parameters such as ;w= are not read here
		if old, dup := vals[k]; dup && old != val {
			p.ignore("RateLimit", v, Conflict)
			return
		}
		vals[k] = strings.TrimSpace(val)
	}
	fields := [3]string{"RateLimit limit", "RateLimit remaining", "RateLimit reset"}
	var lim, rem int64
	var hasLim, hasRem, hasReset bool
	var reset time.Duration
	if s, ok := vals["limit"]; ok {
		var why Reason
		if lim, why = parseCount(s, true); why != "" {
			p.ignore(fields[0], s, why)
		}
		hasLim = why == ""
	}
	if s, ok := vals["remaining"]; ok {
		var why Reason
		if rem, why = parseCount(s, false); why != "" {
			p.ignore(fields[1], s, why)
		}
		hasRem = why == ""
	}
	if s, ok := vals["reset"]; ok {
		sec, why := parseSeconds(s)
		if why == "" && sec >= unixThreshold {
			why = TooFar
		}
		if why != "" {
			p.ignore(fields[2], s, why)
		} else {
			reset, hasReset = p.resetIn(fields[2], s, time.Duration(sec*float64(time.Second)))
		}
	}
	p.check(&p.out.Requests, values{lim, rem, reset, hasLim, hasRem, hasReset}, fields)
}

// draftFields reads RateLimit-Limit, -Remaining and -Reset (revisions 00
// to 06); the limit may carry a window, `100;w=60` or a list of such
// policies, of which the first counts.
func (p *parse) draftFields() {
	fields := [3]string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	var lim int64
	var window time.Duration
	hasLim := false
	if v, ok := p.value(fields[0]); ok {
		first, params, _ := strings.Cut(strings.SplitN(v, ",", 2)[0], ";")
		n, why := parseCount(first, true)
		if why != "" {
			p.ignore(fields[0], v, why)
		} else {
			lim, hasLim = n, true
			if w, ok := strings.CutPrefix(strings.TrimSpace(params), "w="); ok {
				if s, why := parseCount(w, true); why == "" && s <= int64(MaxReset/time.Second) {
					window = time.Duration(s) * time.Second
				} else {
					p.ignore(fields[0], v, Garbage)
				}
			}
		}
	}
	rem, hasRem := p.count(fields[1], false)
	reset, hasReset := p.deltaReset(fields[2])
	p.check(&p.out.Requests, values{lim, rem, reset, hasLim, hasRem, hasReset}, fields)
	if p.out.Requests.Limit > 0 {
		p.out.Requests.Window = window
	}
}

// policy is one RateLimit-Policy item of requests.
type policy struct {
	q int64
	w time.Duration
}

// policies reads RateLimit-Policy: the current form `"name";q=..;w=..`,
// or revision 06's `100;w=60`, keyed by name ("" for the latter). Items
// of another unit than requests are left out.
func (p *parse) policies() map[string]policy {
	lines := p.h.Values("RateLimit-Policy")
	if len(lines) == 0 {
		return nil
	}
	members, err := headers.ParseList(lines...)
	if err != nil {
		p.ignore("RateLimit-Policy", strings.Join(lines, ", "), Garbage)
		return nil
	}
	out := map[string]policy{}
	for _, m := range members {
		name, q, ok := policyItem(m)
		if !ok {
			p.ignore("RateLimit-Policy", strings.Join(lines, ", "), Garbage)
			continue
		}
		if u, ok := m.Params.Get("qu"); ok && (u.Kind != headers.KindString || u.Str != headers.UnitRequests) {
			continue
		}
		pol := policy{q: q}
		if w, ok := m.Params.Get("w"); ok {
			if w.Kind != headers.KindInteger || w.Int <= 0 || w.Int > int64(MaxReset/time.Second) {
				p.ignore("RateLimit-Policy", strings.Join(lines, ", "), Garbage)
				continue
			}
			pol.w = time.Duration(w.Int) * time.Second
		}
		if q <= 0 {
			p.ignore("RateLimit-Policy", strings.Join(lines, ", "), Negative)
			continue
		}
		out[name] = pol
	}
	return out
}

// policyItem returns a policy item's name and quota: a named item's "q",
// or revision 06's bare integer.
func policyItem(m headers.Member) (name string, q int64, ok bool) {
	if m.IsInner {
		return "", 0, false
	}
	switch m.Value.Kind {
	case headers.KindInteger:
		return "", m.Value.Int, true
	case headers.KindString, headers.KindToken:
		v, ok := m.Params.Get("q")
		if !ok || v.Kind != headers.KindInteger {
			return "", 0, false
		}
		return m.Value.Str, v.Int, true
	}
	return "", 0, false
}

// lowestRate returns the policy of the lowest rate q/w (a policy without
// a window counts as none).
func lowestRate(ps map[string]policy) (policy, bool) {
	var best policy
	found := false
	for _, pol := range ps {
		if pol.w <= 0 {
			continue
		}
		if !found || float64(pol.q)/pol.w.Seconds() < float64(best.q)/best.w.Seconds() {
			best, found = pol, true
		}
	}
	return best, found
}

// draftItems reads the current RateLimit items: the one with the fewest
// remaining decides, with the policy of its name.
func (p *parse) draftItems(policies map[string]policy) {
	lines := p.h.Values("RateLimit")
	members, err := headers.ParseList(lines...)
	if err != nil || len(members) == 0 {
		p.ignore("RateLimit", strings.Join(lines, ", "), Garbage)
		return
	}
	found := false
	var best Quota
	var bestPol policy
	var bestHasPol bool
	for _, m := range members {
		if m.IsInner || m.Value.Kind != headers.KindString && m.Value.Kind != headers.KindToken {
			p.ignore("RateLimit", strings.Join(lines, ", "), Garbage)
			continue
		}
		r, okR := m.Params.Get("r")
		t, okT := m.Params.Get("t")
		if !okR || r.Kind != headers.KindInteger || okT && t.Kind != headers.KindInteger {
			p.ignore("RateLimit", strings.Join(lines, ", "), Garbage)
			continue
		}
		if r.Int < 0 || okT && t.Int < 0 {
			p.ignore("RateLimit", strings.Join(lines, ", "), Negative)
			continue
		}
		if !okT {
			p.ignore("RateLimit", strings.Join(lines, ", "), Missing)
			continue
		}
		if t.Int > int64(MaxReset/time.Second) {
			p.ignore("RateLimit", strings.Join(lines, ", "), TooFar)
			continue
		}
		pol, hasPol := policies[m.Value.Str]
		if hasPol && r.Int > pol.q {
			p.ignore("RateLimit", strings.Join(lines, ", "), AboveLimit)
			continue
		}
		if t.Int == 0 {
			continue // reset now: says nothing of the time ahead
		}
		if !found || r.Int < best.Remaining {
			best = Quota{Remaining: r.Int, Reset: time.Duration(t.Int) * time.Second}
			bestPol, bestHasPol, found = pol, hasPol, true
		}
	}
	if found {
		if bestHasPol {
			best.Limit, best.Window = bestPol.q, bestPol.w
		}
		p.out.Requests = best
		return
	}
	if pol, ok := lowestRate(policies); ok {
		p.out.Requests.Limit, p.out.Requests.Window = pol.q, pol.w
	}
}
