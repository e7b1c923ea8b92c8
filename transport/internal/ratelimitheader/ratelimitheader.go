// Package ratelimitheader reads where an upstream says its client stands:
// the rate-limit fields of an answer, in the forms upstreams send, turned
// into one Reading of limit, remaining and reset per dimension (requests,
// tokens).
//
// It is pure: the time comes in as an argument, nothing is kept. A value
// that is missing, garbage, negative, or contradicts another (remaining
// above the limit, two lines of one field that disagree), and a reset
// absurdly far away or in the past, is left out of the Reading and listed
// in its Ignored with the reason, so the transport can count it.
//
// The forms (Form), and how each is read:
//
//   - Draft: the IETF draft draft-ietf-httpapi-ratelimit-headers. Its
//     current form (revisions 07 to 11) is two Structured Field Lists,
//     RateLimit-Policy `"name";q=100;w=60` (quota q per window w seconds)
//     and RateLimit `"name";r=50;t=30` (r left, the quota reset in t
//     seconds), items linked by name; names may be strings or tokens, as
//     revisions differed. The item with the fewest remaining decides, with
//     the policy of its name; without RateLimit, the policy of the lowest
//     rate. Policies whose "qu" is not requests are not requests and are
//     left out. Its older forms are read too: a RateLimit Dictionary
//     `limit=100, remaining=50, reset=30`, and the fields
//     RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset of
//     revisions 00 to 06 (the limit may carry `;w=60`, and RateLimit-Policy
//     of revision 06 `100;w=60`), resets in delta-seconds.
//   - XRateLimit: X-RateLimit-Limit, X-RateLimit-Remaining and
//     X-RateLimit-Reset (GitHub's, Twitter's and many more). The reset is
//     seconds, possibly with a fraction; a value from 1e9 up (2001 as Unix
//     time, 31 years as a delay) is a Unix time, anything less a delay.
//     The window is not stated.
//   - OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}, resets
//     as Go-style durations ("1s", "6m0s", "20ms"). OpenAI documents its
//     limits per minute (RPM, TPM), so the window is a minute.
//   - Anthropic: anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-{limit,remaining,reset}, resets as RFC 3339 times.
//     Anthropic documents its limits per minute, so the window is a
//     minute. The tokens dimension is the combined one when sent, else the
//     input or output one with fewer remaining.
//
// With several forms allowed (All, the default), the first one present in
// the order Draft, Anthropic, OpenAI, XRateLimit is read.
package ratelimitheader

import (
	"fmt"
	"net/http"
	"time"
)

// Form is a set of header forms to read.
type Form uint8

// The forms Parse reads.
const (
	Draft Form = 1 << iota
	Anthropic
	OpenAI
	XRateLimit
	// All is every form: the default, detecting which one an upstream
	// sends.
	All = Draft | Anthropic | OpenAI | XRateLimit
	// Custom marks a Reading of a quota read by the user's own function
	// (see Custom); Parse never reads it.
	Custom Form = 1 << 4
)

// String names the form, or the forms joined by "+".
func (f Form) String() string {
	names := []string{"draft", "anthropic", "openai", "x-ratelimit", "custom"}
	s := ""
	for i, n := range names {
		if f&(1<<i) != 0 {
			if s != "" {
				s += "+"
			}
			s += n
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// MaxReset is the furthest reset Parse accepts: a day. Daily quotas reset
// within one; a reset further away is garbage, or a pause no fleet should
// take from a header.
const MaxReset = 24 * time.Hour

// Quota is what an answer says of one dimension.
type Quota struct {
	// Limit is the quota per Window; 0 when not stated (or ignored).
	Limit int64
	// Window is the window Limit counts over; 0 when not stated.
	Window time.Duration
	// Remaining is what is left of the quota until Reset; meaningful only
	// when Reset is positive.
	Remaining int64
	// Reset is how long until the quota is whole again; 0 when Remaining
	// was not stated (or was ignored).
	Reset time.Duration
}

// Stated reports whether the quota says anything.
func (q Quota) Stated() bool { return q.Limit > 0 || q.Reset > 0 }

// Reason is why a value was ignored.
type Reason string

// The reasons a value is ignored.
const (
	// Garbage: the value does not parse.
	Garbage Reason = "garbage"
	// Negative: a negative count, or a limit of zero.
	Negative Reason = "negative"
	// AboveLimit: remaining is above the limit.
	AboveLimit Reason = "remaining_above_limit"
	// Conflict: two lines of one field disagree.
	Conflict Reason = "conflict"
	// TooFar: the reset is more than MaxReset away.
	TooFar Reason = "reset_too_far"
	// Past: the reset is a time already past.
	Past Reason = "reset_past"
	// Missing: remaining without a reset, or a reset without remaining.
	Missing Reason = "missing"
)

// Reasons lists every Reason, for counters that start at zero.
var Reasons = []Reason{Garbage, Negative, AboveLimit, Conflict, TooFar, Past, Missing}

// Ignored is one value Parse left out.
type Ignored struct {
	// Field names the header field, Value its value as sent.
	Field, Value string
	Reason       Reason
}

// Reading is what one answer's fields say.
type Reading struct {
	// Form is the form read; 0 when none was present.
	Form Form
	// Requests and Tokens are the two dimensions.
	Requests, Tokens Quota
	// Ignored lists the values left out, and why.
	Ignored []Ignored
}

// Parse reads h's rate-limit fields in the first of forms present (see the
// package doc), the answer being read at now.
func Parse(h http.Header, now time.Time, forms Form) Reading {
	type reader struct {
		form Form
		read func(*parse)
	}
	for _, r := range []reader{{Draft, (*parse).draft}, {Anthropic, (*parse).anthropic}, {OpenAI, (*parse).openai}, {XRateLimit, (*parse).xRateLimit}} {
		if forms&r.form == 0 || !present(h, r.form) {
			continue
		}
		p := &parse{h: h, now: now}
		r.read(p)
		if p.present {
			p.out.Form = r.form
			return p.out
		}
	}
	return Reading{}
}

// fields are each form's field names, canonical, so that an answer
// without them costs a map lookup per name and no allocation.
var fields = func() map[Form][]string {
	m := map[Form][]string{
		Draft:      {"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"},
		XRateLimit: {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"},
	}
	for _, dim := range []string{"requests", "tokens"} {
		for _, k := range []string{"limit", "remaining", "reset"} {
			m[OpenAI] = append(m[OpenAI], "x-ratelimit-"+k+"-"+dim)
		}
	}
	for _, dim := range []string{"requests", "tokens", "input-tokens", "output-tokens"} {
		for _, k := range []string{"limit", "remaining", "reset"} {
			m[Anthropic] = append(m[Anthropic], "anthropic-ratelimit-"+dim+"-"+k)
		}
	}
	for f, names := range m {
		for i, n := range names {
			names[i] = http.CanonicalHeaderKey(n)
		}
		m[f] = names
	}
	return m
}()

// present reports whether h holds a field of form f.
func present(h http.Header, f Form) bool {
	for _, k := range fields[f] {
		if _, ok := h[k]; ok {
			return true
		}
	}
	return false
}

// parse is one form's reading in progress.
type parse struct {
	h       http.Header
	now     time.Time
	present bool // a field of the form was there
	out     Reading
}

// value returns the field's value, whether it is present, and whether its
// lines agree (several lines of one field that differ are a Conflict).
func (p *parse) value(field string) (string, bool) {
	vs := p.h.Values(field)
	if len(vs) == 0 {
		return "", false
	}
	p.present = true
	for _, v := range vs[1:] {
		if v != vs[0] {
			p.ignore(field, fmt.Sprint(vs), Conflict)
			return "", false
		}
	}
	return vs[0], true
}

func (p *parse) ignore(field, value string, why Reason) {
	p.out.Ignored = append(p.out.Ignored, Ignored{Field: field, Value: value, Reason: why})
}

// count reads a non-negative integer field (a limit when limit is set,
// which must be positive).
func (p *parse) count(field string, limit bool) (int64, bool) {
	v, ok := p.value(field)
	if !ok {
		return 0, false
	}
	n, why := parseCount(v, limit)
	if why != "" {
		p.ignore(field, v, why)
		return 0, false
	}
	return n, true
}

// values are what one form read of a quota, each with whether it was
// present and valid.
type values struct {
	limit, remaining                 int64
	reset                            time.Duration
	hasLimit, hasRemaining, hasReset bool
}

// check sets q from the values read, leaving out those that contradict
// each other: remaining above the limit drops both, remaining without a
// reset (or a reset without remaining) drops it.
func (p *parse) check(q *Quota, v values, fields [3]string) {
	limit, hasLimit, remaining, hasRemaining, reset, hasReset := v.limit, v.hasLimit, v.remaining, v.hasRemaining, v.reset, v.hasReset
	if hasLimit && hasRemaining && remaining > limit {
		p.ignore(fields[1], fmt.Sprint(remaining), AboveLimit)
		return
	}
	if hasLimit {
		q.Limit = limit
	}
	switch {
	case hasRemaining && hasReset:
		q.Remaining, q.Reset = remaining, reset
	case hasRemaining:
		p.ignore(fields[2], "", Missing)
	case hasReset:
		p.ignore(fields[1], "", Missing)
	}
}

// resetIn checks a reset's duration from now: positive and within
// MaxReset.
func (p *parse) resetIn(field, value string, d time.Duration) (time.Duration, bool) {
	switch {
	case d < 0:
		p.ignore(field, value, Past)
		return 0, false
	case d > MaxReset:
		p.ignore(field, value, TooFar)
		return 0, false
	case d == 0:
		// Reset now: what remains says nothing of the time ahead.
		return 0, false
	}
	return d, true
}

// Check returns the reading of a quota read by the user's own function,
// its values held to the rules the built-in forms are: a limit must be
// positive and its window within MaxReset; remaining at most the limit,
// not negative, and with a reset in (0, MaxReset].
func Check(q Quota) Reading {
	r := Reading{Form: Custom}
	p := &parse{out: r}
	hasLim := q.Limit > 0
	switch {
	case q.Limit < 0:
		p.ignore("limit", fmt.Sprint(q.Limit), Negative)
	case q.Window < 0 || q.Window > MaxReset:
		p.ignore("window", q.Window.String(), Garbage)
		hasLim = false
	}
	hasRem := q.Reset != 0 || q.Remaining != 0
	if q.Remaining < 0 {
		p.ignore("remaining", fmt.Sprint(q.Remaining), Negative)
		hasRem = false
	}
	reset, hasReset := time.Duration(0), false
	if hasRem {
		reset, hasReset = p.resetIn("reset", q.Reset.String(), q.Reset)
		if q.Reset == 0 {
			p.ignore("reset", "0", Missing)
		}
	}
	p.check(&p.out.Requests, values{q.Limit, q.Remaining, reset, hasLim, hasRem && hasReset, hasReset}, [3]string{"limit", "remaining", "reset"})
	if p.out.Requests.Limit > 0 {
		p.out.Requests.Window = q.Window
	}
	return p.out
}
