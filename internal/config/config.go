// Package config loads the YAML configuration of the fleetrate service.
//
// A file holds one or more YAML documents. Each document may carry:
//
//   - an envoyproxy/ratelimit domain (domain, descriptors), which loads
//     unchanged: every rate_limit becomes a token bucket with rate
//     requests_per_unit/unit and burst requests_per_unit;
//   - the fleetrate extensions: burst on any rate_limit, rate_limits (a list
//     of limits enforced together on one descriptor), and buckets (named
//     buckets keyed by channel and endpoint, for an outbound fleet);
//   - a server section with the service's settings.
//
// Every error names the file, the line, the field and the offending value,
// as "fleetrate.yaml:12: descriptors[0].rate_limit.unit: ...".
package config

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/fleetrate/fleetrate"
)

// MaxFileSize bounds the size of a configuration file.
const MaxFileSize = 16 << 20

// Unit is the time unit of a rate limit. The values match the proto enum
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit, so a Unit
// converts to it directly.
type Unit int32

// Units known to envoyproxy/ratelimit and Envoy.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = map[string]Unit{
	"second": Second, "minute": Minute, "hour": Hour, "day": Day,
	"week": Week, "month": Month, "year": Year,
}

// ParseUnit parses a unit name such as "second" or "MINUTE".
func ParseUnit(s string) (Unit, bool) {
	u, ok := unitNames[strings.ToLower(s)]
	return u, ok
}

// String returns the unit's lower-case name, such as "minute".
func (u Unit) String() string {
	for name, v := range unitNames {
		if v == u {
			return name
		}
	}
	return fmt.Sprintf("unit(%d)", int32(u))
}

// Duration returns the length of one unit. A month is 30 days and a year
// 365 days. It returns 0 for an unknown unit.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// LimitSpec is one configured limit: requests_per_unit per unit (times
// unit_multiplier), with a burst.
type LimitSpec struct {
	// Name is the optional name from the file.
	Name string
	// RequestsPerUnit is the number of requests allowed per period. Zero
	// denies every request, as in envoyproxy/ratelimit.
	RequestsPerUnit uint32
	// Unit is the period's unit.
	Unit Unit
	// UnitMultiplier is the number of units in the period (at least 1).
	UnitMultiplier uint32
	// Burst is the bucket's capacity: RequestsPerUnit unless the file sets
	// burst.
	Burst int64
}

// Period returns the limit's period: UnitMultiplier units.
func (l LimitSpec) Period() time.Duration {
	return time.Duration(max(l.UnitMultiplier, 1)) * l.Unit.Duration()
}

// Denies reports whether the limit admits nothing (requests_per_unit 0).
func (l LimitSpec) Denies() bool { return l.RequestsPerUnit == 0 }

// Limit returns the token-bucket limit: RequestsPerUnit tokens per period,
// holding at most Burst. Its name is the spec's Name, or a description
// such as "100/minute".
func (l LimitSpec) Limit() fleetrate.Limit {
	p := l.Period()
	rate := math.Inf(1)
	if p > 0 {
		rate = float64(l.RequestsPerUnit) * float64(time.Second) / float64(p)
	}
	name := l.Name
	if name == "" {
		name = l.String()
	}
	return fleetrate.Limit{Name: name, Rate: rate, Burst: l.Burst}
}

// String formats the spec as "100/minute" or "100/10minute burst 20".
func (l LimitSpec) String() string {
	s := fmt.Sprintf("%d/", l.RequestsPerUnit)
	if l.UnitMultiplier > 1 {
		s += fmt.Sprintf("%d", l.UnitMultiplier)
	}
	s += l.Unit.String()
	if l.Burst != int64(l.RequestsPerUnit) {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	return s
}

// Validate checks that the limit can be enforced. A denying limit is
// always valid.
func (l LimitSpec) Validate() error {
	if l.Unit.Duration() == 0 {
		return fmt.Errorf("unit: unknown unit %d", int32(l.Unit))
	}
	if l.Denies() {
		return nil
	}
	return l.Limit().Validate()
}

// Rule is the rate_limit (or rate_limits) of one descriptor in a domain.
type Rule struct {
	// ID is the rule's path in the domain, as envoyproxy/ratelimit names it
	// in its statistics: "domain.key_value.subkey".
	ID string
	// Limits are enforced together on one bucket. Empty when Unlimited.
	Limits []LimitSpec
	// Quotas are the calendar quotas of the rule's bucket (quotas in the
	// file), enforced with Limits in one take.
	Quotas []fleetrate.Quota
	// Unlimited rules always admit, without touching the store.
	Unlimited bool
	// ShadowMode rules are evaluated and counted, but never deny.
	ShadowMode bool
	// QuotaMode rules deny a request only when every quota_mode rule of
	// the request is over its limit (envoyproxy/ratelimit's quota_mode);
	// their own status still says OVER_LIMIT.
	QuotaMode bool
	// Metadata is the descriptor's metadata, returned to Envoy as dynamic
	// metadata when the request passes; nil when the file gives none.
	Metadata *structpb.Struct
	// DetailedMetric labels metrics with the request's values.
	DetailedMetric bool
	// Name is the rule's rate_limit.name, used by Replaces.
	Name string
	// Replaces lists the names of rules this one replaces when both apply
	// to the same request.
	Replaces []string
	// File and Line locate the rule.
	File string
	Line int
}

// Denies reports whether some limit of the rule admits nothing.
func (r *Rule) Denies() bool {
	for _, l := range r.Limits {
		if l.Denies() {
			return true
		}
	}
	return false
}

// TokenLimits returns the rule's token-bucket limits. It must not be
// called on an unlimited or denying rule.
func (r *Rule) TokenLimits() []fleetrate.Limit {
	out := make([]fleetrate.Limit, len(r.Limits))
	for i, l := range r.Limits {
		out[i] = l.Limit()
	}
	return out
}

// Domain is one envoyproxy/ratelimit domain: a tree of descriptors.
type Domain struct {
	// Name is the domain, as requests name it.
	Name string
	// Rules counts the rules in the domain.
	Rules int
	root  *node
}

// Bucket is a named bucket of the outbound fleet, keyed by channel and
// endpoint.
type Bucket struct {
	// Name is how the APIs name the bucket: "channel/endpoint", or
	// "channel" for a channel-wide bucket.
	Name string
	// Channel and Endpoint are the parts of the name; Endpoint may be
	// empty.
	Channel, Endpoint string
	// Key is the store key without the prefix. The channel is a Redis
	// Cluster hash tag, so every bucket of one channel lives on one slot
	// and a take across them is atomic: "{booking_com}/availability",
	// "{booking_com}".
	Key string
	// Limits are enforced together.
	Limits []LimitSpec
	// Quotas are the bucket's calendar quotas (quotas in the file),
	// enforced with Limits in one take.
	Quotas []fleetrate.Quota
	// InFlight, when above 0, bounds the takes of the bucket in flight
	// across the fleet (in_flight, 1 to fleetrate.MaxInFlight): each
	// holds a permit from /v1/acquire to /v1/release.
	InFlight int64
	// File and Line locate the bucket.
	File string
	Line int
}

// TokenLimits returns the bucket's token-bucket limits.
func (b Bucket) TokenLimits() []fleetrate.Limit {
	out := make([]fleetrate.Limit, len(b.Limits))
	for i, l := range b.Limits {
		out[i] = l.Limit()
	}
	return out
}

// BucketKey returns the store key (without prefix) of the bucket named
// channel/endpoint: "{channel}/endpoint", or "{channel}" without endpoint.
func BucketKey(channel, endpoint string) string {
	if endpoint == "" {
		return "{" + channel + "}"
	}
	return "{" + channel + "}/" + endpoint
}

// Settings are the server settings a file may give in its server section.
// A nil field was not set in the file. Each field is the setting of the
// same name in snake case (HTTPAddr is http_addr), documented in
// docs/OPERATIONS.md; flags and environment variables override them.
type Settings struct {
	HTTPAddr        *string
	GRPCAddr        *string
	Redis           *string
	Prefix          *string
	AuthTokenFile   *string
	TLSCertFile     *string
	TLSKeyFile      *string
	TLSClientCAFile *string
	LogFormat       *string
	LogLevel        *string
	MaxWait         *time.Duration
	ReadTimeout     *time.Duration
	WriteTimeout    *time.Duration
	IdleTimeout     *time.Duration
	ShutdownTimeout *time.Duration
	DrainDelay      *time.Duration
	StoreTimeout    *time.Duration
	ReloadInterval  *time.Duration
	MaxRequestBytes *int64
	ResponseHeaders *bool
	ShadowMode      *bool
	StoreAPI        *bool
	RedisBatch      *bool
	AdaptiveProcs   *bool

	HealthChecksStore       *bool
	TLSHTTP                 *bool
	QuotaMode               *bool
	FixedWindow             *bool
	ResponseDynamicMetadata *bool
	MetricsAddr             *string
	MetricsPath             *string
	MemoryMaxKeys           *int64
	MemoryMaxBytes          *int64
	MaxMetricDescriptors    *int64
	LocalCacheBytes         *int64
	NearLimitRatio          *float64

	// envoyproxy/ratelimit's response headers, the pinned name of mTLS
	// clients, the ageing and keepalive of gRPC connections, and the TLS
	// files of the Redis connection.
	LimitHeaders         *bool
	LimitHeaderLimit     *string
	LimitHeaderRemaining *string
	LimitHeaderReset     *string
	TLSClientSAN         *string
	GRPCMaxConnAge       *time.Duration
	GRPCMaxConnAgeGrace  *time.Duration
	GRPCKeepaliveTime    *time.Duration
	GRPCKeepaliveTimeout *time.Duration
	RedisTLSCAFile       *string
	RedisTLSCertFile     *string
	RedisTLSKeyFile      *string
	RedisTLSSkipHostname *bool

	// The failure policy, breaker and load bound of the service.
	FailurePolicy   *string
	BreakerFailures *int64
	BreakerCoolOff  *time.Duration
	FleetSize       *int64
	MaxInFlight     *int64
	LatencyTarget   *time.Duration
}

// Config is a loaded configuration file. It is immutable once loaded and
// safe for concurrent use.
type Config struct {
	// Path is the file it was loaded from.
	Path string
	// Hash is the SHA-256 of the file's content.
	Hash [32]byte
	// Domains maps each domain name to its descriptors.
	Domains map[string]*Domain
	// Buckets lists the named buckets in file order.
	Buckets []Bucket
	// Upstreams lists the upstreams of the outbound API in file order.
	Upstreams []Upstream
	// Settings are the file's server section.
	Settings Settings
	// Notices list what the file says that was accepted but has no
	// effect, such as a field envoyproxy/ratelimit ignores at that level.
	// The server logs them once when it loads the file.
	Notices []Problem

	byName map[string]int
}

// Domain returns the named domain, or nil.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.Domains[name]
}

// Bucket returns the bucket with the given name. Both the plain name
// ("booking_com/availability") and the key form
// ("{booking_com}/availability") are accepted.
func (c *Config) Bucket(name string) (Bucket, bool) {
	if c == nil {
		return Bucket{}, false
	}
	i, ok := c.byName[name]
	if !ok {
		return Bucket{}, false
	}
	return c.Buckets[i], true
}

// Summary lists what was loaded, for the startup log line.
func (c *Config) Summary() (domains []string, rules, buckets int) {
	for name, d := range c.Domains {
		domains = append(domains, name)
		rules += d.Rules
	}
	sort.Strings(domains)
	return domains, rules, len(c.Buckets)
}

func newConfig(path string, hash [32]byte) *Config {
	return &Config{Path: path, Hash: hash, Domains: map[string]*Domain{}, byName: map[string]int{}}
}

// LoadFile reads and parses the file at path.
func LoadFile(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: config: %w", fleetrate.ErrInvalid, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: config: %w", fleetrate.ErrInvalid, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("%w: config: %s is a directory, want a YAML file", fleetrate.ErrInvalid, path)
	}
	buf, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: config: %w", fleetrate.ErrInvalid, err)
	}
	return Load(path, buf)
}

// Load parses data, naming file in errors. The error, if any, wraps
// fleetrate.ErrInvalid and lists every problem found (up to a bound), one
// per line, as "file:line: field: message".
func Load(file string, data []byte) (*Config, error) {
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%w: config: %s is larger than %d bytes", fleetrate.ErrInvalid, file, MaxFileSize)
	}
	cfg := newConfig(file, sha256.Sum256(data))
	p := &parser{file: file, shared: &shared{}}
	p.parse(data, cfg)
	if len(p.errs) > 0 {
		return nil, &Error{Problems: p.errs}
	}
	cfg.Notices = p.notices
	return cfg, nil
}

// Problem is one error in a file.
type Problem struct {
	File  string
	Line  int
	Field string
	Msg   string
}

// String formats the problem as "file:line: field: message".
func (p Problem) String() string {
	s := p.File
	if p.Line > 0 {
		s += fmt.Sprintf(":%d", p.Line)
	}
	if p.Field != "" {
		s += ": " + p.Field
	}
	return s + ": " + p.Msg
}

// Error lists the problems of a rejected file. It unwraps to
// fleetrate.ErrInvalid.
type Error struct {
	Problems []Problem
}

// Error lists the problems, one per line.
func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns fleetrate.ErrInvalid.
func (e *Error) Unwrap() error { return fleetrate.ErrInvalid }
