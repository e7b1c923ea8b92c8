// Package headers formats and parses the HTTP header fields that
// fleetrate sends and reads about rate limits:
//
//   - RateLimit-Policy and RateLimit, per the IETF draft
//     draft-ietf-httpapi-ratelimit-headers (revision 11, May 2026), whose
//     values are Structured Field Lists (RFC 9651);
//   - Retry-After (RFC 9110 Section 10.2.3) as delta-seconds, rounded up;
//   - the legacy X-RateLimit-Limit, X-RateLimit-Remaining and
//     X-RateLimit-Reset fields that many clients still read.
//
// Formatting never emits a value the grammar rejects: every builder
// validates its input and returns an error naming the bad value. The
// parsers check the draft's rules as well as the grammar, so they serve
// both clients that read these fields and tests that check what a server
// sent.
package headers

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"
)

// Header field names.
const (
	// RateLimitPolicy advertises the quota policies a server enforces.
	RateLimitPolicy = "RateLimit-Policy"
	// RateLimit reports the service limit that currently applies.
	RateLimit = "RateLimit"
	// RetryAfter tells a client how long to wait before trying again.
	RetryAfter = "Retry-After"
	// XRateLimitLimit is the legacy field for the quota of the tightest
	// limit.
	XRateLimitLimit = "X-RateLimit-Limit"
	// XRateLimitRemaining is the legacy field for the quota left.
	XRateLimitRemaining = "X-RateLimit-Remaining"
	// XRateLimitReset is the legacy field for when the quota is fully
	// restored, in Unix seconds.
	XRateLimitReset = "X-RateLimit-Reset"
)

// Parameter keys of the draft.
const (
	paramQuota     = "q"
	paramQuotaUnit = "qu"
	paramWindow    = "w"
	paramPartition = "pk"
	paramRemaining = "r"
	paramReset     = "t"
)

// Quota units registered by the draft. An empty unit means requests.
const (
	UnitRequests           = "requests"
	UnitContentBytes       = "content-bytes"
	UnitConcurrentRequests = "concurrent-requests"
)

// ErrInvalid is wrapped by every error about a value that cannot be sent
// or that breaks the draft's rules when parsed.
var ErrInvalid = errors.New("invalid rate limit header")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// Policy is one quota policy item of the RateLimit-Policy field, such as
// "default";q=100;w=60.
type Policy struct {
	// Name identifies the policy; it is sent as an sf-string and must be
	// printable ASCII.
	Name string
	// Quota is the "q" parameter: the quota units the policy allocates.
	// It must be between 0 and MaxInteger.
	Quota int64
	// Unit is the "qu" parameter, one of the Unit constants; empty omits
	// it (the draft's default is requests).
	Unit string
	// Window is the "w" parameter. It is sent in whole seconds, rounded
	// up, since the draft has no sub-second windows. 0 omits it.
	Window time.Duration
	// PartitionKey is the "pk" parameter, a byte sequence; nil omits it.
	PartitionKey []byte
}

// Limit is one service limit item of the RateLimit field, such as
// "default";r=50;t=30.
type Limit struct {
	// Name identifies the policy the limit belongs to (an sf-string).
	Name string
	// Remaining is the "r" parameter: the quota units available now.
	// It must be between 0 and MaxInteger.
	Remaining int64
	// Reset is the "t" parameter: the effective window, the time within
	// which the client can use no more than Remaining. It is sent in
	// whole seconds, rounded up. It is sent only when HasReset is true.
	Reset time.Duration
	// HasReset reports whether Reset is sent (or was present).
	HasReset bool
	// PartitionKey is the "pk" parameter; nil omits it.
	PartitionKey []byte
}

// DelaySeconds returns d in whole seconds, rounded up: the delta-seconds
// a client must wait so that it waits at least d. Zero and negative
// durations give 0.
func DelaySeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// FormatRetryAfter formats d as the delta-seconds of a Retry-After field,
// rounded up, so that a client that waits the advertised time has waited
// at least d. A positive d never formats as "0".
func FormatRetryAfter(d time.Duration) string {
	return strconv.FormatInt(DelaySeconds(d), 10)
}

// seconds converts a duration for a "w" or "t" parameter, rounding up.
func seconds(field string, d time.Duration) (int64, error) {
	if d < 0 {
		return 0, invalid("%s must not be negative, got %v", field, d)
	}
	s := DelaySeconds(d)
	if s > MaxInteger {
		return 0, invalid("%s %v is out of range", field, d)
	}
	return s, nil
}

func checkName(field, name string) error {
	if err := ValidString(name); err != nil {
		return invalid("%s name %q must be printable ASCII", field, name)
	}
	return nil
}

func checkCount(field string, n int64) error {
	if n < 0 || n > MaxInteger {
		return invalid("%s must be between 0 and %d, got %d", field, int64(MaxInteger), n)
	}
	return nil
}

// FormatPolicy returns the value of a RateLimit-Policy field listing ps,
// for example "burst";q=100;w=60, "daily";q=1000;w=86400. At least one
// policy is required and names must be unique.
func FormatPolicy(ps ...Policy) (string, error) {
	if len(ps) == 0 {
		return "", invalid("RateLimit-Policy needs at least one policy")
	}
	members := make([]Member, 0, len(ps))
	for i, p := range ps {
		if err := checkName("policy", p.Name); err != nil {
			return "", err
		}
		for _, o := range ps[:i] {
			if o.Name == p.Name {
				return "", invalid("policy name %q appears twice", p.Name)
			}
		}
		if err := checkCount("policy "+strconv.Quote(p.Name)+" quota", p.Quota); err != nil {
			return "", err
		}
		params := Params{{Key: paramQuota, Value: Integer(p.Quota)}}
		if p.Unit != "" {
			if err := ValidString(p.Unit); err != nil {
				return "", invalid("policy %q quota unit %q must be printable ASCII", p.Name, p.Unit)
			}
			params = append(params, Param{Key: paramQuotaUnit, Value: String(p.Unit)})
		}
		if p.Window != 0 {
			w, err := seconds("policy "+strconv.Quote(p.Name)+" window", p.Window)
			if err != nil {
				return "", err
			}
			params = append(params, Param{Key: paramWindow, Value: Integer(w)})
		}
		if p.PartitionKey != nil {
			params = append(params, Param{Key: paramPartition, Value: ByteSeq(p.PartitionKey)})
		}
		members = append(members, Member{Value: String(p.Name), Params: params})
	}
	return SerializeList(members)
}

// FormatRateLimit returns the value of a RateLimit field listing ls, for
// example "default";r=50;t=30. At least one limit is required.
func FormatRateLimit(ls ...Limit) (string, error) {
	if len(ls) == 0 {
		return "", invalid("RateLimit needs at least one limit")
	}
	members := make([]Member, 0, len(ls))
	for _, l := range ls {
		if err := checkName("limit", l.Name); err != nil {
			return "", err
		}
		if err := checkCount("limit "+strconv.Quote(l.Name)+" remaining", l.Remaining); err != nil {
			return "", err
		}
		params := Params{{Key: paramRemaining, Value: Integer(l.Remaining)}}
		if l.HasReset {
			t, err := seconds("limit "+strconv.Quote(l.Name)+" reset", l.Reset)
			if err != nil {
				return "", err
			}
			params = append(params, Param{Key: paramReset, Value: Integer(t)})
		}
		if l.PartitionKey != nil {
			params = append(params, Param{Key: paramPartition, Value: ByteSeq(l.PartitionKey)})
		}
		members = append(members, Member{Value: String(l.Name), Params: params})
	}
	return SerializeList(members)
}

// ParsePolicy parses RateLimit-Policy field lines and checks the draft's
// rules: a non-empty list of items, each a String with a non-negative
// Integer "q", optional String "qu", positive Integer "w" and Byte
// Sequence "pk". Other parameters are allowed and ignored, as the draft
// says.
func ParsePolicy(lines ...string) ([]Policy, error) {
	members, err := ParseList(lines...)
	if err != nil {
		return nil, fmt.Errorf("%w: RateLimit-Policy: %w", ErrInvalid, err)
	}
	if len(members) == 0 {
		return nil, invalid("RateLimit-Policy must not be empty")
	}
	out := make([]Policy, 0, len(members))
	for i, m := range members {
		if m.IsInner || m.Value.Kind != KindString {
			return nil, invalid("RateLimit-Policy member %d must be a string item", i)
		}
		p := Policy{Name: m.Value.Str}
		q, ok := m.Params.Get(paramQuota)
		if !ok {
			return nil, invalid("RateLimit-Policy %q lacks the required q parameter", p.Name)
		}
		if q.Kind != KindInteger || q.Int < 0 {
			return nil, invalid("RateLimit-Policy %q: q must be a non-negative integer", p.Name)
		}
		p.Quota = q.Int
		if u, ok := m.Params.Get(paramQuotaUnit); ok {
			if u.Kind != KindString {
				return nil, invalid("RateLimit-Policy %q: qu must be a string", p.Name)
			}
			p.Unit = u.Str
		}
		if w, ok := m.Params.Get(paramWindow); ok {
			if w.Kind != KindInteger || w.Int <= 0 {
				return nil, invalid("RateLimit-Policy %q: w must be a positive integer", p.Name)
			}
			p.Window = secondsToDuration(w.Int)
		}
		if pk, ok := m.Params.Get(paramPartition); ok {
			if pk.Kind != KindByteSeq {
				return nil, invalid("RateLimit-Policy %q: pk must be a byte sequence", p.Name)
			}
			p.PartitionKey = pk.Bytes
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseRateLimit parses RateLimit field lines and checks the draft's
// rules: a list of items, each a String with a non-negative Integer "r",
// an optional non-negative Integer "t" and an optional Byte Sequence
// "pk".
func ParseRateLimit(lines ...string) ([]Limit, error) {
	members, err := ParseList(lines...)
	if err != nil {
		return nil, fmt.Errorf("%w: RateLimit: %w", ErrInvalid, err)
	}
	if len(members) == 0 {
		return nil, invalid("RateLimit must not be empty")
	}
	out := make([]Limit, 0, len(members))
	for i, m := range members {
		if m.IsInner || m.Value.Kind != KindString {
			return nil, invalid("RateLimit member %d must be a string item", i)
		}
		l := Limit{Name: m.Value.Str}
		r, ok := m.Params.Get(paramRemaining)
		if !ok {
			return nil, invalid("RateLimit %q lacks the required r parameter", l.Name)
		}
		if r.Kind != KindInteger || r.Int < 0 {
			return nil, invalid("RateLimit %q: r must be a non-negative integer", l.Name)
		}
		l.Remaining = r.Int
		if t, ok := m.Params.Get(paramReset); ok {
			if t.Kind != KindInteger || t.Int < 0 {
				return nil, invalid("RateLimit %q: t must be a non-negative integer", l.Name)
			}
			l.Reset, l.HasReset = secondsToDuration(t.Int), true
		}
		if pk, ok := m.Params.Get(paramPartition); ok {
			if pk.Kind != KindByteSeq {
				return nil, invalid("RateLimit %q: pk must be a byte sequence", l.Name)
			}
			l.PartitionKey = pk.Bytes
		}
		out = append(out, l)
	}
	return out, nil
}

// secondsToDuration converts sf-integer seconds (at most 15 digits) to a
// duration, saturating at the largest duration.
func secondsToDuration(s int64) time.Duration {
	if s > math.MaxInt64/int64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s) * time.Second
}

// Legacy holds the values of the X-RateLimit-* fields.
type Legacy struct {
	// Limit is the quota of the tightest limit.
	Limit int64
	// Remaining is the quota left now.
	Remaining int64
	// Reset is when the quota is fully restored; it is sent as Unix
	// seconds, rounded up, the de facto convention of these fields.
	Reset time.Time
}

// SetLegacy sets the X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset fields of h.
func SetLegacy(h http.Header, l Legacy) {
	h.Set(XRateLimitLimit, strconv.FormatInt(max(l.Limit, 0), 10))
	h.Set(XRateLimitRemaining, strconv.FormatInt(max(l.Remaining, 0), 10))
	reset := l.Reset.Unix()
	if l.Reset.Nanosecond() > 0 {
		reset++
	}
	h.Set(XRateLimitReset, strconv.FormatInt(reset, 10))
}
