package transport

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/sendtime"
)

// ErrNoRoute is returned (wrapped) when a Classify built by
// Upstream.Classifier finds no endpoint for a request. Nothing is sent.
var ErrNoRoute = errors.New("transport: no endpoint matches the request")

// Target says which shared buckets a request draws from and what it costs.
// A Classify returns one per request.
type Target struct {
	// Channel names the upstream, e.g. "booking_com". It must not be
	// empty and must not contain '{', '}' or '#'.
	Channel string
	// Endpoint names the documented limit the request counts against, e.g.
	// "availability". It must not be empty and must not contain '#'.
	Endpoint string
	// Entity optionally identifies what the request is about (a property
	// or hotel id) for the logs. When empty, the value set on the request's
	// context with WithEntity is used.
	Entity string
	// Cost is the number of tokens the request takes. 0 means 1.
	Cost int64
	// Credential makes the request also draw from the channel's
	// credential-wide bucket, atomically with the endpoint bucket: both
	// grant or neither does.
	Credential bool
	// DrainCredential makes a 429 on this request also drain the
	// credential-wide bucket, pausing every endpoint of the channel that
	// draws from it, not only this endpoint.
	DrainCredential bool
	// Bypass sends the request straight to the base transport, unpaced
	// and never retried (e.g. an OAuth token refresh).
	Bypass bool
	// Fixed paces the request at the documented limits always: its 429s
	// pause the fleet but do not lower the effective rate (see Adaptive).
	Fixed bool
	// Priority is the request's priority class on its buckets (see
	// fleetrate.Priority), unless its context names one with
	// fleetrate.WithPriority. Empty means the top class.
	Priority string
	// Spacing, when set, sends the request through the endpoint's
	// fleet-wide spacing gate (see Endpoint.Spacing). Set by a Classify of
	// your own, it is checked against its bounds but not against the
	// endpoint's limits, as Upstream.Validate checks Endpoint.Spacing.
	Spacing time.Duration
	// Costs are what the request costs the channel's meters, by meter
	// name (see Upstream.Meters and MeterBucket), e.g. {"tokens": 1200}:
	// it draws them from the meters' buckets atomically with its
	// endpoint's (and credential's) tokens. A meter not named costs
	// nothing.
	Costs map[string]int64
	// Settle, when set, reads what the request really cost the meters
	// from its answer, and the transport settles the booking to it (see
	// Settle).
	Settle Settle
	// Headers says how the upstream's rate-limit fields are read (see
	// RateLimitHeaders); nil reads every form built in.
	Headers *RateLimitHeaders
}

// validate checks the target, naming the failing field and value.
func (t Target) validate() error {
	if err := checkChannel(t.Channel); err != nil {
		return fmt.Errorf("%w: target: %w", fleetrate.ErrInvalid, err)
	}
	if err := checkEndpoint(t.Endpoint); err != nil {
		return fmt.Errorf("%w: target (channel %q): %w", fleetrate.ErrInvalid, t.Channel, err)
	}
	if t.Cost < 0 {
		return fmt.Errorf("%w: target: cost must be >= 0, got %d", fleetrate.ErrInvalid, t.Cost)
	}
	if err := sendtime.CheckSpacing(t.Spacing); err != nil {
		return fmt.Errorf("%w: target: spacing %w", fleetrate.ErrInvalid, err)
	}
	if t.Headers != nil {
		if err := t.Headers.validate("target: headers"); err != nil {
			return err
		}
	}
	return t.checkCosts()
}

func checkChannel(ch string) error {
	switch {
	case ch == "":
		return errors.New("channel must not be empty")
	case strings.ContainsAny(ch, "{}#"):
		return fmt.Errorf("channel %q must not contain '{', '}' or '#'", ch)
	}
	return nil
}

func checkEndpoint(ep string) error {
	switch {
	case ep == "":
		return errors.New("endpoint must not be empty")
	case strings.Contains(ep, "#"):
		return fmt.Errorf("endpoint %q must not contain '#'", ep)
	}
	return nil
}

func (t Target) cost() int64 {
	if t.Cost == 0 {
		return 1
	}
	return t.Cost
}

// buckets returns the names the request draws from.
func (t Target) buckets() []string {
	if len(t.Costs) > 0 {
		return t.metered()
	}
	if t.Credential {
		return []string{EndpointBucket(t.Channel, t.Endpoint), CredentialBucket(t.Channel)}
	}
	return []string{EndpointBucket(t.Channel, t.Endpoint)}
}

// drained returns the names of the buckets a 429 on the request drains
// (their pause markers are drained with them).
func (t Target) drained() []string {
	names := []string{EndpointBucket(t.Channel, t.Endpoint)}
	if t.DrainCredential {
		names = append(names, CredentialBucket(t.Channel))
	}
	return names
}

// EndpointBucket returns the bucket name of one endpoint of a channel,
// "{channel}/endpoint". The channel in braces is a Redis Cluster hash tag,
// so an endpoint bucket and its channel's credential bucket live in one
// slot and can be taken together atomically.
func EndpointBucket(channel, endpoint string) string {
	return "{" + channel + "}/" + endpoint
}

// CredentialBucket returns the name of a channel's credential-wide bucket,
// "{channel}".
func CredentialBucket(channel string) string {
	return "{" + channel + "}"
}

// PauseBucket returns the name of the pause marker kept beside a bucket,
// bucket + "#pause". A 429 drains the marker for the pause, every take of
// the bucket also takes from its marker (so it is booked after the pause,
// and learns how long the pause lasts), and a request whose booked wait
// ends inside a pause goes back in the queue instead of sending. A marker
// is so large (PauseLimit) that takes never deplete it: it holds exactly
// the pause.
func PauseBucket(bucket string) string {
	return hold.PauseKey(bucket)
}

// PauseLimit is the limit of pause markers, which Upstream.Buckets
// configures so that a Limiter (or a status page) can peek them: a peek's
// RetryAfter is what is left of the pause. See the holds in
// transport/internal/hold.
var PauseLimit = hold.PauseLimit

// Classify maps an outgoing request to the buckets it draws from. An error
// fails the request before anything is sent.
type Classify func(*http.Request) (Target, error)

// Endpoint is one documented endpoint of an upstream.
type Endpoint struct {
	// Name is the endpoint's name in bucket names, logs and metrics, e.g.
	// "availability".
	Name string
	// Pattern selects the requests that count against this endpoint. It
	// uses http.ServeMux syntax, e.g. "POST /v1/hotels/{id}/availability"
	// or "GET api.example.com/reservations". Patterns must not conflict.
	Pattern string
	// Limits are the endpoint's limits, e.g. 95 % of the documented
	// ceiling: fleetrate.PerSecond(19, 1) for "20 requests per second".
	Limits []fleetrate.Limit
	// Cost is the tokens one request takes. 0 means 1.
	Cost int64
	// Spacing, when set (between 1ms and 1m), is the least time the
	// upstream admits between two of the endpoint's requests: a strict
	// window, which documents a rate and no burst (50ms for "20 requests
	// per second, one at a time"). Limits must then have burst 1 and pace
	// at most one request per Spacing + SpacingMargin, better at 95 % of
	// the window. Each request also passes a fleet-wide gate in the store
	// just before it goes out, which keeps sends Spacing + SpacingMargin
	// apart however late they wake; and a request whose answer comes back
	// late holds the gate shut for that long, since it may have reached
	// the upstream late, and the next one, on time, would reach it too
	// soon. The gate costs a store call per request, and one per late
	// answer. Its hold reaches the next request only if the answer comes
	// back within about three quarters of Spacing. See docs/OPERATIONS.md,
	// "Strict windows: the spacing gate".
	Spacing time.Duration
	// Priority is the priority class of the endpoint's requests, one of
	// the upstream's Priorities (a request's context may name another with
	// fleetrate.WithPriority). Empty means the top class.
	Priority string
	// InFlight, when above 0 (at most fleetrate.MaxInFlight), bounds how
	// many of the endpoint's requests are in flight at once across the
	// fleet: a request takes a permit with its tokens, in the same store
	// take, waits for one first come first served (within the max wait)
	// when none is free, and holds it until its response body is read to
	// its end or closed, or its round trip fails. See "In-flight bounds"
	// in the package documentation.
	InFlight int64
	// Costs are what one request costs the upstream's meters, by meter
	// name (see Upstream.Meters), when CostFunc is nil: an estimate, which
	// Settle corrects from the answer.
	Costs map[string]int64
	// CostFunc, when set, returns what a request costs the meters, by
	// meter name, in place of Costs: e.g. an LLM request's prompt size
	// plus its max_tokens. It must not consume the request's body (read a
	// copy from GetBody). An error fails the request before it is sent.
	CostFunc func(*http.Request) (map[string]int64, error)
	// Settle, when set, reads what a request really cost the meters from
	// its answer (see Settle).
	Settle Settle
}

// Upstream describes an upstream API's documented limits: one bucket per
// endpoint and optionally a credential-wide bucket every endpoint also
// draws from. It yields both the Limiter's bucket configuration (Buckets)
// and the request mapping (Classifier), so the two cannot disagree.
type Upstream struct {
	// Channel names the upstream, e.g. "booking_com".
	Channel string
	// Credential, when set, are limits on all requests made with the
	// channel's credential together, whatever the endpoint.
	Credential []fleetrate.Limit
	// Endpoints are the documented endpoints.
	Endpoints []Endpoint
	// DrainCredential makes a 429 on any endpoint pause the whole channel.
	// By default only the endpoint that answered 429 pauses.
	DrainCredential bool
	// Fixed turns adaptive pacing off for this upstream: its requests are
	// paced at the documented limits whatever it answers (see Adaptive).
	Fixed bool
	// Priorities are the priority classes below the top one on every
	// bucket of the upstream, endpoints' and credential's (see
	// fleetrate.Priority): a bulk class keeps a reserve of each bucket for
	// the classes above it and books at most its horizon ahead, so that a
	// booking confirmation is not queued behind an inventory push.
	Priorities []fleetrate.Priority
	// CredentialInFlight, when above 0, bounds the requests in flight
	// with the channel's credential, whatever the endpoint, as
	// Endpoint.InFlight bounds one endpoint's. It needs Credential limits.
	CredentialInFlight int64
	// Meters are budgets of the upstream counted in units of their own,
	// such as an LLM API's tokens per minute beside its requests per
	// minute: each is a bucket of the channel that requests draw from by
	// what they cost it (Endpoint.Costs, Endpoint.CostFunc).
	Meters []Meter
	// Headers says how the upstream's answers' rate-limit fields are read
	// and steer the fleet (see RateLimitHeaders). The zero value reads
	// every form built in; Headers.Off reads none.
	Headers RateLimitHeaders
}

// Validate checks the upstream, naming the failing field and value.
func (u Upstream) Validate() error {
	if err := checkChannel(u.Channel); err != nil {
		return fmt.Errorf("%w: upstream: %w", fleetrate.ErrInvalid, err)
	}
	if len(u.Endpoints) == 0 {
		return fmt.Errorf("%w: upstream %q: endpoints: at least one is required", fleetrate.ErrInvalid, u.Channel)
	}
	if err := u.Headers.validate(fmt.Sprintf("upstream %q: headers", u.Channel)); err != nil {
		return err
	}
	for i, l := range u.Credential {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("%w: upstream %q: credential[%d]: %w", fleetrate.ErrInvalid, u.Channel, i, err)
		}
	}
	if u.DrainCredential && len(u.Credential) == 0 {
		return fmt.Errorf("%w: upstream %q: drain credential needs credential limits", fleetrate.ErrInvalid, u.Channel)
	}
	seen := make(map[string]bool, len(u.Endpoints))
	for i, e := range u.Endpoints {
		field := fmt.Sprintf("upstream %q: endpoints[%d]", u.Channel, i)
		if err := checkEndpoint(e.Name); err != nil {
			return fmt.Errorf("%w: %s.name: %w", fleetrate.ErrInvalid, field, err)
		}
		if e.Cost < 0 {
			return fmt.Errorf("%w: %s.cost: must be >= 0, got %d", fleetrate.ErrInvalid, field, e.Cost)
		}
		if seen[e.Name] {
			return fmt.Errorf("%w: %s.name: duplicate %q", fleetrate.ErrInvalid, field, e.Name)
		}
		seen[e.Name] = true
		if e.Pattern == "" {
			return fmt.Errorf("%w: %s.pattern: must not be empty", fleetrate.ErrInvalid, field)
		}
		if len(e.Limits) == 0 {
			return fmt.Errorf("%w: %s.limits: at least one limit is required", fleetrate.ErrInvalid, field)
		}
		if err := checkSpacing(e, field); err != nil {
			return err
		}
		if e.Priority != "" && !slices.ContainsFunc(u.Priorities, func(p fleetrate.Priority) bool { return p.Name == e.Priority }) {
			return fmt.Errorf("%w: %s.priority: %q is not one of the upstream's priorities", fleetrate.ErrInvalid, field, e.Priority)
		}
		for j, l := range e.Limits {
			if err := l.Validate(); err != nil {
				return fmt.Errorf("%w: %s.limits[%d]: %w", fleetrate.ErrInvalid, field, j, err)
			}
			if e.Cost > l.Burst {
				return fmt.Errorf("%w: %s.cost: %d exceeds burst %d of limits[%d]", fleetrate.ErrInvalid, field, e.Cost, l.Burst, j)
			}
		}
		for j, l := range u.Credential {
			if e.Cost > l.Burst {
				return fmt.Errorf("%w: %s.cost: %d exceeds burst %d of credential[%d]", fleetrate.ErrInvalid, field, e.Cost, l.Burst, j)
			}
		}
	}
	return u.validateMeters()
}

// Buckets returns the bucket configuration for a fleetrate.Config: each
// endpoint's bucket, the credential bucket when Credential is set, and the
// pause marker of each. It assumes a valid Upstream.
func (u Upstream) Buckets() []fleetrate.BucketConfig {
	var bs []fleetrate.BucketConfig
	add := func(name string, limits []fleetrate.Limit) {
		bs = append(bs,
			fleetrate.BucketConfig{Name: name, Limits: slices.Clone(limits), Priorities: slices.Clone(u.Priorities)},
			fleetrate.BucketConfig{Name: PauseBucket(name), Limits: []fleetrate.Limit{PauseLimit}})
	}
	if len(u.Credential) > 0 {
		add(CredentialBucket(u.Channel), u.Credential)
	}
	for _, e := range u.Endpoints {
		add(EndpointBucket(u.Channel, e.Name), e.Limits)
	}
	return u.meterBuckets(bs)
}

// routeHandler marks the endpoint a ServeMux pattern belongs to. It is
// never served.
type routeHandler int

// ServeHTTP does nothing: a routeHandler only marks a pattern.
func (routeHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

// Classifier returns a Classify that maps each request to the endpoint
// whose pattern matches it, or fails with ErrNoRoute. Requests draw from
// the credential bucket when Credential is set.
func (u Upstream) Classifier() (Classify, error) {
	if err := u.Validate(); err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	for i, e := range u.Endpoints {
		if err := handle(mux, e.Pattern, routeHandler(i)); err != nil {
			return nil, fmt.Errorf("%w: upstream %q: endpoints[%d].pattern: %w", fleetrate.ErrInvalid, u.Channel, i, err)
		}
	}
	endpoints := slices.Clone(u.Endpoints)
	credential := len(u.Credential) > 0
	var hdrs *RateLimitHeaders
	if h := u.Headers; h.Off || h.Forms != 0 || h.Window != 0 || h.Read != nil {
		hdrs = &h
	}
	return func(req *http.Request) (Target, error) {
		if req.URL == nil {
			return Target{}, fmt.Errorf("%w: request has no URL", ErrNoRoute)
		}
		r := req
		if r.Host == "" {
			// A client request may leave Host to URL.Host; ServeMux
			// matches host patterns against Host. Copy, never modify.
			rc := *req
			rc.Host = req.URL.Host
			r = &rc
		}
		h, _ := mux.Handler(r)
		i, ok := h.(routeHandler)
		if !ok {
			return Target{}, fmt.Errorf("%w: %s %s (channel %q)", ErrNoRoute, req.Method, req.URL.Path, u.Channel)
		}
		e := endpoints[i]
		return e.costs(req, Target{
			Channel:         u.Channel,
			Endpoint:        e.Name,
			Cost:            e.Cost,
			Credential:      credential,
			Fixed:           u.Fixed,
			DrainCredential: u.DrainCredential,
			Priority:        e.Priority,
			Spacing:         e.Spacing,
			Settle:          e.Settle,
			Headers:         hdrs,
		})
	}, nil
}

// handle registers a pattern, turning ServeMux's panic on a malformed or
// conflicting pattern into an error.
func handle(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}
