// Package httplimit is net/http middleware that protects an API with
// fleetrate token buckets: one bucket per client (API key, principal, IP
// address, route, or any key you choose) and policy, kept in any
// fleetrate.Store, so that every instance of a service sharing a Redis
// store enforces one budget.
//
// Every response carries the RateLimit-Policy and RateLimit header fields
// of the IETF draft draft-ietf-httpapi-ratelimit-headers, such as
//
//	RateLimit-Policy: "messages";q=20;w=2
//	RateLimit: "messages";r=13;t=0
//
// A refused request gets 429 Too Many Requests, a Retry-After in
// delta-seconds rounded up (so a client that obeys it is admitted), and an
// application/problem+json body (RFC 9457) naming the exhausted policy.
// When the store fails, the middleware fails open (the default) or closed
// with 503, never with 429; it logs with log/slog and counts with
// Prometheus. Shadow mode evaluates and reports without ever refusing.
//
// A plan sold by the calendar, such as 10,000 requests a month resetting
// on the 1st, is a policy (or a tier of one) with calendar quotas beside
// its limits (Policy.Quotas; Policy.QuotaZone resets them at each
// client's own midnight). The RateLimit fields then report whichever of
// the bucket and the quotas has the fewest left, and a quota's refusal
// carries its window's end. UsageHandler answers a client's usage as
// JSON, for a "my usage" page.
//
// The middleware has the standard shape func(http.Handler) http.Handler,
// so it mounts on http.ServeMux routes, chi (r.With(mw)) and gorilla/mux
// (route.Handler(mw(h)) or router.Use(mw)) alike:
//
//	m, err := httplimit.New(httplimit.Config{
//		Store: memstore.New(memstore.Options{}),
//		Key:   httplimit.APIKey("X-API-Key"),
//	})
//	...
//	limit, err := m.Limit(httplimit.Policy{
//		Name:   "messages",
//		Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 20)},
//	})
//	...
//	mux.Handle("POST /v1/messages", limit(createMessage))
package httplimit

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/headers"
)

// Header field names the middleware sets.
const (
	HeaderRateLimitPolicy     = headers.RateLimitPolicy
	HeaderRateLimit           = headers.RateLimit
	HeaderRetryAfter          = headers.RetryAfter
	HeaderXRateLimitLimit     = headers.XRateLimitLimit
	HeaderXRateLimitRemaining = headers.XRateLimitRemaining
	HeaderXRateLimitReset     = headers.XRateLimitReset
)

// Defaults applied when a Config field is zero.
const (
	// DefaultPrefix namespaces the middleware's store keys. The full key of
	// a bucket is Prefix + policy name + ":" + escaped client key.
	DefaultPrefix = "fleetrate:http:"
	// DefaultTimeout bounds each store call. A slow store is treated as a
	// failed one, so a Redis outage costs a request at most this long.
	DefaultTimeout = 250 * time.Millisecond
	// MaxPolicyNameLen is the longest policy or limit name.
	MaxPolicyNameLen = 64
	// MaxUnitsPerToken is the largest Policy.UnitsPerToken: 1 MiB.
	MaxUnitsPerToken = 1 << 20
	// storeErrorLogInterval is the least time between two logged store
	// errors of one Middleware; the ones in between are counted and the
	// count is logged with the next one.
	storeErrorLogInterval = time.Second
)

// Config configures a Middleware. The zero value of each field means its
// default; only Store is required.
type Config struct {
	// Store keeps the buckets: memstore for one process, redisstore for a
	// fleet. Required.
	Store fleetrate.Store
	// Prefix is prepended to every store key. It may hold a Redis
	// {hash tag}; client keys never do. The default is DefaultPrefix.
	Prefix string
	// Key identifies the client of a request for policies without a Key
	// of their own. The default keys by the TCP peer's address, trusting
	// no forwarding header: ClientIP(IPConfig{}).
	Key KeyFunc
	// KeyError answers a request whose key function failed. The default
	// answers 400 Bad Request with a problem+json body carrying the error,
	// or 500 Internal Server Error when a key function of this package's
	// was misconfigured (APIKey("")), the server's fault.
	KeyError func(w http.ResponseWriter, r *http.Request, err error)
	// FailClosed answers 503 Service Unavailable when the store fails or
	// times out. The default, false, fails open: the request is served
	// unlimited. Either way the failure is logged and counted, and it is
	// never answered with 429.
	FailClosed bool
	// Shadow evaluates every policy and sets the RateLimit headers but never
	// refuses a request, not even when the store fails: a request that
	// would have been refused is logged at Info level and counted as
	// shadow_denied. Use it to roll out a limit safely. Policy.Shadow sets
	// it for one policy.
	Shadow bool
	// LegacyHeaders also sets X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset (Unix seconds). The default is off.
	LegacyHeaders bool
	// Timeout bounds each store call; the request's own deadline applies
	// when it is earlier. The default is DefaultTimeout (250 ms); a
	// negative value means no bound beyond the request's context.
	Timeout time.Duration
	// Logger receives store failures (Error), shadow denials (Info) and
	// denials (Debug). The default is slog.Default().
	Logger *slog.Logger
	// Exempt names requests that bypass every policy of the Middleware:
	// they are served unlimited, without RateLimit fields, and counted as
	// outcome "exempt". The default exempts nothing.
	Exempt Exemptions
	// Refused renders a refusal in place of the default problem+json body,
	// with the decision at hand. When it is called the RateLimit-Policy and
	// RateLimit fields, and Retry-After when waiting helps, are set; it
	// writes the status (normally Refusal.Status) and the body. The default
	// writes Refusal.Problem with Refusal.Status.
	Refused func(w http.ResponseWriter, r *http.Request, ref Refusal)
	// Unavailable renders the answer to a request whose store call failed
	// when failing closed. Retry-After: 1 is set when it is called. The
	// default answers 503 with a problem+json body.
	Unavailable func(w http.ResponseWriter, r *http.Request, err error)
	// Registerer receives the metrics fleetrate_http_requests_total{policy,
	// outcome}, fleetrate_http_store_errors_total{policy} and
	// fleetrate_http_store_duration_seconds{policy}. Nil, the default,
	// means no metrics. Several Middlewares may share one Registerer.
	Registerer prometheus.Registerer
}

// Exemptions name the requests that bypass limiting. A request is exempt
// when any of the three matches.
type Exemptions struct {
	// Keys are client keys, as a policy's KeyFunc returns them, that are
	// never limited: "apikey:" + HashKey(secret) for APIKey, or
	// "ip:203.0.113.7/32" for ClientIP.
	Keys []string
	// Peers are networks whose TCP peers (the request's RemoteAddr) are
	// never limited, such as an internal health checker. Behind a proxy
	// every peer is the proxy: exempt forwarded clients by Keys instead.
	Peers []netip.Prefix
	// Func reports whether a request is exempt, for routes, methods or
	// anything else. It must be safe for concurrent use.
	Func func(*http.Request) bool
}

// Refusal describes a refused request to Config.Refused.
type Refusal struct {
	// Status is the default status: 429, or 413 for a request of a
	// content-bytes policy that costs more than the burst.
	Status int
	// Policy is the header item name of the limit that refused.
	Policy string
	// Cost is the request's cost in quota units.
	Cost int64
	// RetryAfter is how long until the request would be admitted; 0 when
	// waiting cannot help (the cost exceeds the burst).
	RetryAfter time.Duration
	// Result is the store's decision; for a cost above the burst, a peek
	// that took nothing (zero if the peek failed).
	Result fleetrate.Result
	// Problem is the body the default answer writes.
	Problem Problem
}

// Validate checks the configuration, naming the offending field.
func (c Config) Validate() error {
	if c.Store == nil {
		return fmt.Errorf("%w: httplimit: config: store is required", fleetrate.ErrInvalid)
	}
	for i, p := range c.Exempt.Peers {
		if !p.IsValid() {
			return fmt.Errorf("%w: httplimit: config: exempt peers[%d] is not a valid prefix", fleetrate.ErrInvalid, i)
		}
	}
	if len(c.Prefix) > 256 {
		return fmt.Errorf("%w: httplimit: config: prefix must be at most 256 bytes, got %d", fleetrate.ErrInvalid, len(c.Prefix))
	}
	return nil
}

// Middleware builds rate-limiting middleware for policies over one store.
// It is safe for concurrent use.
type Middleware struct {
	store      fleetrate.Store
	prefix     string
	key        KeyFunc
	keyError   func(http.ResponseWriter, *http.Request, error)
	refused    func(http.ResponseWriter, *http.Request, Refusal)
	unavail    func(http.ResponseWriter, *http.Request, error)
	exemptKeys map[string]bool
	exemptNets []netip.Prefix
	exemptFunc func(*http.Request) bool
	failClosed bool
	shadow     bool
	legacy     bool
	timeout    time.Duration
	log        *slog.Logger
	metrics    *metrics

	mu       sync.Mutex
	policies map[string]string // a mounted policy's limits and quotas, by name
	lastLog  time.Time
	dropped  int
}

// New returns a Middleware, or an error naming the invalid field.
func New(cfg Config) (*Middleware, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	m := &Middleware{
		store:      cfg.Store,
		prefix:     cfg.Prefix,
		key:        cfg.Key,
		keyError:   cfg.KeyError,
		refused:    cfg.Refused,
		unavail:    cfg.Unavailable,
		exemptFunc: cfg.Exempt.Func,
		failClosed: cfg.FailClosed,
		shadow:     cfg.Shadow,
		legacy:     cfg.LegacyHeaders,
		timeout:    cfg.Timeout,
		log:        cfg.Logger,
		metrics:    met,
		policies:   make(map[string]string),
	}
	if m.prefix == "" {
		m.prefix = DefaultPrefix
	}
	if m.key == nil {
		if m.key, err = ClientIP(IPConfig{}); err != nil {
			return nil, err
		}
	}
	if m.keyError == nil {
		m.keyError = defaultKeyError
	}
	if m.refused == nil {
		m.refused = defaultRefused
	}
	if m.unavail == nil {
		m.unavail = defaultUnavailable
	}
	m.exemptKeys, m.exemptNets = exemptions(cfg.Exempt)
	if m.timeout == 0 {
		m.timeout = DefaultTimeout
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	return m, nil
}

// exemptions returns the exempt keys as a set and the exempt peers as
// masked prefixes, IPv4-mapped ones as IPv4.
func exemptions(e Exemptions) (map[string]bool, []netip.Prefix) {
	var keys map[string]bool
	for _, k := range e.Keys {
		if keys == nil {
			keys = make(map[string]bool, len(e.Keys))
		}
		keys[k] = true
	}
	var nets []netip.Prefix
	for _, p := range e.Peers {
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		nets = append(nets, p.Masked())
	}
	return keys, nets
}

// policy is a validated Policy ready to serve.
type policy struct {
	m        *Middleware
	name     string
	lim      *fleetrate.Limiter
	limits   []fleetrate.Limit
	items    []string // header item names, one per limit
	quotas   []int64  // advertised "q" per limit, in quota units
	windows  []int64  // advertised "w" per limit, in seconds
	header   string
	key      KeyFunc
	cost     CostFunc
	shadow   bool
	minBurst int64  // the smallest burst: no request may cost more
	minItem  string // the item name of the limit with that burst
	unit     string // for messages: "requests" unless Policy.Unit says otherwise
	upt      int64  // quota units per token
	bytes    bool   // the unit is content-bytes: a cost above the burst is a 413
	inFlight int64  // Policy.InFlight
	cal      []fleetrate.Quota
	calItems []string // header item names, one per quota of cal
	zones    *zones   // with Policy.QuotaZone
}

// Limit returns middleware enforcing p on every request of the handlers it
// wraps, or an error naming what is wrong with p.
func (m *Middleware) Limit(p Policy) (func(http.Handler) http.Handler, error) {
	var s interface {
		serve(http.ResponseWriter, *http.Request, http.Handler)
	}
	var err error
	if len(p.Tiers) > 0 || p.Tier != nil {
		s, err = m.compileTiers(p)
	} else {
		s, err = m.compile(p)
	}
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				http.Error(w, "httplimit: the middleware was given a nil http.Handler to protect", http.StatusInternalServerError)
			})
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.serve(w, r, next)
		})
	}, nil
}

func (m *Middleware) compile(p Policy) (*policy, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	limits := slices.Clone(p.Limits)
	cal := slices.Clone(p.Quotas)
	cfg := fleetrate.Config{Prefix: m.prefix + p.Name + ":", Limits: limits, InFlight: p.InFlight, Quotas: cal}
	lim, err := fleetrate.New(m.store, cfg)
	if err != nil {
		return nil, fmt.Errorf("httplimit: policy %q: %w", p.Name, err)
	}
	m.mu.Lock()
	prev, seen := m.policies[p.Name]
	if shape := mountedShape(limits, cal); seen && prev != shape {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: httplimit: policy %q is already mounted with other limits or quotas (%s); give it another name", fleetrate.ErrInvalid, p.Name, prev)
	}
	m.policies[p.Name] = mountedShape(limits, cal)
	m.mu.Unlock()
	pol := &policy{
		m:        m,
		name:     p.Name,
		lim:      lim,
		limits:   limits,
		key:      p.Key,
		cost:     p.Cost,
		shadow:   p.Shadow || m.shadow,
		unit:     p.Unit,
		upt:      max(p.UnitsPerToken, 1),
		bytes:    p.Unit == headers.UnitContentBytes,
		inFlight: p.InFlight,
		cal:      cal,
	}
	if p.QuotaZone != nil {
		pol.zones = &zones{zone: p.QuotaZone, cfg: cfg}
	}
	if pol.unit == "" {
		pol.unit = headers.UnitRequests
	}
	if pol.key == nil {
		pol.key = m.key
	}
	if err := pol.advertise(p.Unit); err != nil {
		return nil, err
	}
	return pol, nil
}

// advertise computes what the RateLimit fields say of each limit (its
// item name, quota and window) and the RateLimit-Policy field, in unit.
func (pol *policy) advertise(unit string) error {
	hp := make([]headers.Policy, len(pol.limits))
	for i, l := range pol.limits {
		item := pol.name
		if l.Name != "" {
			item += "." + l.Name
		}
		if l.Burst > headers.MaxInteger/pol.upt {
			return fmt.Errorf("%w: httplimit: policy %q: limits[%d]: burst %d times %d units per token exceeds the headers' largest integer %d",
				fleetrate.ErrInvalid, pol.name, i, l.Burst, pol.upt, int64(headers.MaxInteger))
		}
		q, w := headers.QuotaWindow(l.Interval(), l.Burst)
		pol.items = append(pol.items, item)
		pol.quotas = append(pol.quotas, q*pol.upt)
		pol.windows = append(pol.windows, w)
		if i == 0 || l.Burst < pol.minBurst {
			pol.minBurst, pol.minItem = l.Burst, item
		}
		hp[i] = headers.Policy{Name: item, Quota: q * pol.upt, Unit: unit, Window: time.Duration(w) * time.Second}
	}
	hp = pol.advertiseQuotas(hp, unit)
	var err error
	if pol.header, err = headers.FormatPolicy(hp...); err != nil {
		return fmt.Errorf("httplimit: policy %q: %w", pol.name, err)
	}
	return nil
}

func (p *policy) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if p.m.exemptRequest(r) {
		p.m.metrics.request(p.name, OutcomeExempt)
		next.ServeHTTP(w, r)
		return
	}
	key, cost, lim, ok := p.keyAndCost(w, r)
	if !ok {
		return
	}
	if p.m.exemptKeys[key] {
		p.m.metrics.request(p.name, OutcomeExempt)
		next.ServeHTTP(w, r)
		return
	}
	if cost > p.minBurst {
		p.tooCostly(w, r, lim, key, cost, next)
		return
	}
	if p.inFlight > 0 {
		p.serveInFlight(w, r, lim, key, cost, next)
		return
	}
	res, err := p.take(r, lim, key, cost)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client has gone; there is no one to answer
		}
		p.m.storeFailed(w, r, p, err, next)
		return
	}
	item := p.setHeaders(w.Header(), res)
	if res.Allowed {
		p.m.metrics.request(p.name, OutcomeAllowed)
		next.ServeHTTP(w, r)
		return
	}
	p.refuse(w, r, res, item, next)
}

// exemptRequest reports whether the request's peer or Exempt.Func exempts
// it.
func (m *Middleware) exemptRequest(r *http.Request) bool {
	if len(m.exemptNets) > 0 {
		if a, ok := parseHost(r.RemoteAddr); ok {
			for _, n := range m.exemptNets {
				if n.Contains(a) {
					return true
				}
			}
		}
	}
	return m.exemptFunc != nil && m.exemptFunc(r)
}

// keyAndCost identifies the client, the limiter of its time zone (see
// Policy.QuotaZone) and prices the request, answering the request itself
// when any fails.
func (p *policy) keyAndCost(w http.ResponseWriter, r *http.Request) (key string, cost int64, lim *fleetrate.Limiter, ok bool) {
	m := p.m
	key, err := p.key(r)
	if err == nil && key == "" {
		err = fmt.Errorf("%w: the key function returned an empty key", ErrNoKey)
	}
	if err == nil {
		lim, err = p.limiter(r)
	}
	if err != nil {
		m.metrics.request(p.name, OutcomeNoKey)
		m.keyError(w, r, err)
		return "", 0, nil, false
	}
	if p.cost == nil {
		return key, 1, lim, true
	}
	cost, err = p.cost(r)
	if err == nil && cost < 0 {
		err = fmt.Errorf("negative cost %d", cost)
	}
	if err != nil {
		m.metrics.request(p.name, OutcomeBadCost)
		writeProblem(w, http.StatusBadRequest, &Problem{
			Title:  http.StatusText(http.StatusBadRequest),
			Detail: "cannot compute the cost of this request: " + err.Error(),
		})
		return "", 0, nil, false
	}
	return key, cost, lim, true
}

// take asks the store for cost tokens of the client's bucket, within the
// middleware's timeout. A cost of 0 peeks.
func (p *policy) take(r *http.Request, lim *fleetrate.Limiter, key string, cost int64) (fleetrate.Result, error) {
	ctx, cancel := r.Context(), context.CancelFunc(func() {})
	if p.m.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, p.m.timeout)
	}
	start := time.Now()
	res, err := lim.AllowN(ctx, cost, bucketName(key))
	cancel()
	p.m.metrics.observe(p.name, time.Since(start))
	return res, err
}

// tooCostly answers a request that costs more than the burst of one of
// the policy's limits: it can never be admitted, so no Retry-After is
// sent (waiting cannot help), but the RateLimit fields report the
// client's bucket, read with a peek that takes nothing. A content-bytes
// policy answers 413 Content Too Large, any other 429.
func (p *policy) tooCostly(w http.ResponseWriter, r *http.Request, lim *fleetrate.Limiter, key string, cost int64, next http.Handler) {
	m := p.m
	m.metrics.request(p.name, OutcomeBadCost)
	m.log.LogAttrs(r.Context(), slog.LevelWarn, "fleetrate: request cost exceeds the burst of its policy",
		slog.String("policy", p.name), slog.Int64("cost", cost), slog.Int64("burst", p.minBurst))
	w.Header().Set(HeaderRateLimitPolicy, p.header)
	res, err := p.take(r, lim, key, 0)
	if err == nil {
		p.setHeaders(w.Header(), res)
	}
	if p.shadow {
		next.ServeHTTP(w, r)
		return
	}
	status, prob := http.StatusTooManyRequests, &Problem{
		Type:             ProblemQuotaExceeded,
		Title:            "Quota Exceeded",
		Detail:           fmt.Sprintf("this request costs %d %s, more than the %d that policy %q can ever grant; it will never be admitted", cost*p.upt, p.unit, p.minBurst*p.upt, p.minItem),
		ViolatedPolicies: []string{p.minItem},
	}
	if p.bytes {
		status = http.StatusRequestEntityTooLarge
		prob.Type, prob.Title = "", http.StatusText(status)
		prob.Detail = fmt.Sprintf("the request body counts as %d bytes, more than the %d that policy %q can ever grant", cost*p.upt, p.minBurst*p.upt, p.minItem)
	}
	m.refused(w, r, Refusal{Status: status, Policy: p.minItem, Cost: cost * p.upt, Result: res, Problem: *prob})
}
