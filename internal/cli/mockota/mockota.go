// Package mockota is a mock OTA (online travel agency) API for tests and
// the demo: an http.Handler that enforces documented per-endpoint limits
// exactly, plus one hidden sub-limit, and answers 429 with Retry-After.
//
// # Accounting
//
// Every limit is a sliding-window log: a limit of N per window W admits a
// request at time t only if fewer than N accepted requests arrived in
// (t-W, t]. This is the strictest reading of "N requests per second": no
// window of length W, wherever it starts, ever holds more than N accepted
// requests. Rejected requests are not counted. A request is accepted only
// if every limit that applies admits it, and then it counts in all of
// them.
//
// A 429 from a documented limit carries Retry-After: the whole seconds
// until the oldest request in the window leaves it, at least 1. A 429 from
// the hidden limit carries its configured Retry-After.
package mockota

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Reasons a request was answered 429, as reported in the X-Mock-Reason
// header and in Arrival.
const (
	ReasonDocumented = "documented"
	ReasonHidden     = "hidden"
	ReasonInjected   = "injected"
)

// HeaderReason names the response header saying why a 429 was sent.
const HeaderReason = "X-Mock-Reason"

// DefaultWindow is the window of every limit whose Window is zero.
const DefaultWindow = time.Second

// DefaultMaxLog bounds the arrivals kept for Arrivals.
const DefaultMaxLog = 1 << 20

// Endpoint is one documented endpoint.
type Endpoint struct {
	// Name identifies the endpoint in stats, e.g. "availability".
	Name string
	// Pattern selects its requests, in http.ServeMux syntax, e.g.
	// "POST /v1/hotels/{hotel}/availability".
	Pattern string
	// Limit is the documented ceiling: at most Limit accepted requests in
	// any window. 0 means unlimited.
	Limit int
}

// Hidden is an undocumented sub-limit, as real OTAs have: at most Limit
// accepted requests per Window to one endpoint, per value of a path
// wildcard (e.g. per hotel) or for the whole endpoint when Key is empty.
type Hidden struct {
	// Endpoint is the name of the endpoint it applies to.
	Endpoint string
	// Key is the path wildcard the limit is kept per, e.g. "hotel".
	Key string
	// Limit is the most accepted requests per window and key. It must be
	// at least 1.
	Limit int
	// Window is the sliding window. The default is DefaultWindow.
	Window time.Duration
	// RetryAfter is what its 429s say. The default is 1 s; it is sent
	// rounded up to whole seconds.
	RetryAfter time.Duration
}

// Config configures an OTA. The zero value of each field means its default.
type Config struct {
	// Endpoints are the documented endpoints; at least one is required.
	Endpoints []Endpoint
	// Credential is the documented credential-wide ceiling: at most this
	// many accepted requests over all endpoints in any window. 0 means
	// none.
	Credential int
	// Window is the sliding window of the documented limits. The default
	// is DefaultWindow (1 s).
	Window time.Duration
	// Hidden is the optional hidden sub-limit.
	Hidden *Hidden
	// Now is the clock. The default is time.Now.
	Now func() time.Time
	// MaxLog bounds the arrivals kept. The default is DefaultMaxLog.
	MaxLog int
}

// Demo returns the limits the demo and the tests use, modelled on a
// channel manager's OTA: availability 20/s, rate plans 5/s and
// reservations 10/s, at most 30/s over the whole credential, and a hidden
// limit of 2 rate-plan updates per second for one hotel.
func Demo() Config {
	return Config{
		Endpoints: []Endpoint{
			{Name: "availability", Pattern: "POST /v1/hotels/{hotel}/availability", Limit: 20},
			{Name: "rates", Pattern: "POST /v1/hotels/{hotel}/rates", Limit: 5},
			{Name: "reservations", Pattern: "GET /v1/hotels/{hotel}/reservations", Limit: 10},
		},
		Credential: 30,
		Hidden:     &Hidden{Endpoint: "rates", Key: "hotel", Limit: 2, RetryAfter: time.Second},
	}
}

// Validate checks the configuration, naming the failing field and value.
func (c Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return errors.New("mockota: endpoints: at least one is required")
	}
	seen := map[string]bool{}
	for i, e := range c.Endpoints {
		switch {
		case e.Name == "":
			return fmt.Errorf("mockota: endpoints[%d].name: must not be empty", i)
		case seen[e.Name]:
			return fmt.Errorf("mockota: endpoints[%d].name: duplicate %q", i, e.Name)
		case e.Pattern == "":
			return fmt.Errorf("mockota: endpoints[%d].pattern: must not be empty", i)
		case e.Limit < 0:
			return fmt.Errorf("mockota: endpoints[%d].limit: must be >= 0, got %d", i, e.Limit)
		}
		seen[e.Name] = true
	}
	switch {
	case c.Credential < 0:
		return fmt.Errorf("mockota: credential: must be >= 0, got %d", c.Credential)
	case c.Window < 0:
		return fmt.Errorf("mockota: window: must be >= 0, got %v", c.Window)
	case c.MaxLog < 0:
		return fmt.Errorf("mockota: max log: must be >= 0, got %d", c.MaxLog)
	}
	if h := c.Hidden; h != nil {
		switch {
		case !seen[h.Endpoint]:
			return fmt.Errorf("mockota: hidden.endpoint: unknown endpoint %q", h.Endpoint)
		case h.Limit < 1:
			return fmt.Errorf("mockota: hidden.limit: must be >= 1, got %d", h.Limit)
		case h.Window < 0:
			return fmt.Errorf("mockota: hidden.window: must be >= 0, got %v", h.Window)
		case h.RetryAfter < 0:
			return fmt.Errorf("mockota: hidden.retry_after: must be >= 0, got %v", h.RetryAfter)
		}
	}
	return nil
}

// Stats counts one endpoint's requests.
type Stats struct {
	// Requests is every request received.
	Requests int
	// Accepted were answered 200.
	Accepted int
	// Documented were answered 429 because a documented limit (the
	// endpoint's or the credential's) was reached.
	Documented int
	// Hidden were answered 429 by the hidden sub-limit.
	Hidden int
	// Injected were answered with a response queued by Inject.
	Injected int
	// Peak is the most accepted requests seen in any one window.
	Peak int
}

// Limited returns every 429.
func (s Stats) Limited() int { return s.Documented + s.Hidden + s.Injected }

// Arrival is one request as the OTA saw it.
type Arrival struct {
	// At is when it arrived, on the OTA's clock.
	At time.Time
	// Endpoint is the matched endpoint's name.
	Endpoint string
	// Key is the hidden limit's key value, if any (e.g. the hotel).
	Key string
	// Status is the answer: 200 or 429 (or an injected status).
	Status int
	// Reason is why a 429 was sent; empty for a 200.
	Reason string
}

// window is a sliding-window log of accepted arrival times.
type window struct {
	limit int
	width time.Duration
	times []time.Time // ascending; only those inside the window are kept
	peak  int
}

func (w *window) prune(now time.Time) {
	cut := 0
	for cut < len(w.times) && !w.times[cut].After(now.Add(-w.width)) {
		cut++
	}
	if cut > 0 {
		w.times = append(w.times[:0], w.times[cut:]...)
	}
}

// admits reports whether one more request fits at now, after prune.
func (w *window) admits() bool { return w.limit == 0 || len(w.times) < w.limit }

// retryAfter is how long until the oldest request leaves the window.
func (w *window) retryAfter(now time.Time) time.Duration {
	if len(w.times) == 0 {
		return 0
	}
	return w.times[0].Add(w.width).Sub(now)
}

func (w *window) add(now time.Time) {
	w.times = append(w.times, now)
	w.peak = max(w.peak, len(w.times))
}

type injected struct {
	status     int
	retryAfter string
}

type endpointState struct {
	Endpoint
	win    window
	stats  Stats
	inject []injected
}

// OTA is the mock API. It is an http.Handler, safe for concurrent use.
type OTA struct {
	mux    *http.ServeMux
	now    func() time.Time
	hidden *Hidden
	maxLog int

	mu         sync.Mutex
	endpoints  map[string]*endpointState
	order      []string
	credential window
	hiddenWins map[string]*window
	log        []Arrival
}

var _ http.Handler = (*OTA)(nil)

// New returns an OTA, or an error naming the invalid field.
func New(cfg Config) (*OTA, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := cfg.Window
	if w == 0 {
		w = DefaultWindow
	}
	o := &OTA{
		mux:        http.NewServeMux(),
		now:        cfg.Now,
		maxLog:     cfg.MaxLog,
		endpoints:  map[string]*endpointState{},
		credential: window{limit: cfg.Credential, width: w},
		hiddenWins: map[string]*window{},
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.maxLog == 0 {
		o.maxLog = DefaultMaxLog
	}
	if cfg.Hidden != nil {
		h := *cfg.Hidden
		if h.Window == 0 {
			h.Window = DefaultWindow
		}
		if h.RetryAfter == 0 {
			h.RetryAfter = time.Second
		}
		o.hidden = &h
	}
	for i, e := range cfg.Endpoints {
		st := &endpointState{Endpoint: e, win: window{limit: e.Limit, width: w}}
		o.endpoints[e.Name] = st
		o.order = append(o.order, e.Name)
		if err := handle(o.mux, e.Pattern, o.serve(st)); err != nil {
			return nil, fmt.Errorf("mockota: endpoints[%d].pattern: %w", i, err)
		}
	}
	return o, nil
}

func handle(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// ServeHTTP answers a request: 404 for an unknown path, otherwise 200 or
// 429 with Retry-After as the limits decide.
func (o *OTA) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mux.ServeHTTP(w, r)
}

func (o *OTA) serve(st *endpointState) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := ""
		if o.hidden != nil && o.hidden.Endpoint == st.Name && o.hidden.Key != "" {
			key = r.PathValue(o.hidden.Key)
		}
		status, reason, retryAfter := o.decide(st, key)
		if status == http.StatusOK {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"status": "ok", "endpoint": st.Name})
			return
		}
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set(HeaderReason, reason)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": "rate_limited", "endpoint": st.Name, "reason": reason})
	})
}

// decide applies the limits to one request and records it.
func (o *OTA) decide(st *endpointState, key string) (status int, reason, retryAfter string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	st.stats.Requests++
	defer func() {
		if len(o.log) < o.maxLog {
			o.log = append(o.log, Arrival{At: now, Endpoint: st.Name, Key: key, Status: status, Reason: reason})
		}
	}()

	if len(st.inject) > 0 {
		in := st.inject[0]
		st.inject = st.inject[1:]
		st.stats.Injected++
		return in.status, ReasonInjected, in.retryAfter
	}

	st.win.prune(now)
	o.credential.prune(now)
	var hw *window
	if o.hidden != nil && o.hidden.Endpoint == st.Name {
		hw = o.hiddenWins[key]
		if hw == nil {
			hw = &window{limit: o.hidden.Limit, width: o.hidden.Window}
			o.hiddenWins[key] = hw
		}
		hw.prune(now)
	}
	switch {
	case !st.win.admits():
		st.stats.Documented++
		return http.StatusTooManyRequests, ReasonDocumented, seconds(st.win.retryAfter(now))
	case !o.credential.admits():
		st.stats.Documented++
		return http.StatusTooManyRequests, ReasonDocumented, seconds(o.credential.retryAfter(now))
	case hw != nil && !hw.admits():
		st.stats.Hidden++
		return http.StatusTooManyRequests, ReasonHidden, seconds(o.hidden.RetryAfter)
	}
	st.win.add(now)
	o.credential.add(now)
	if hw != nil {
		hw.add(now)
	}
	st.stats.Accepted++
	st.stats.Peak = st.win.peak
	return http.StatusOK, "", ""
}

// seconds formats d as Retry-After delta-seconds: rounded up, at least 1.
func seconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	return strconv.FormatInt(max(s, 1), 10)
}

// Inject queues a response for the next request to endpoint, answered
// before any limit is applied: status (e.g. 429 or 503) with the given
// Retry-After header value, none when empty. Injected answers are served
// in order, one per request.
func (o *OTA) Inject(endpoint string, status int, retryAfter string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	st, ok := o.endpoints[endpoint]
	if !ok {
		return fmt.Errorf("mockota: inject: unknown endpoint %q", endpoint)
	}
	if status < 100 || status > 999 {
		return fmt.Errorf("mockota: inject: status must be a 3-digit code, got %d", status)
	}
	st.inject = append(st.inject, injected{status: status, retryAfter: retryAfter})
	return nil
}

// Stats returns each endpoint's counts by name.
func (o *OTA) Stats() map[string]Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[string]Stats, len(o.endpoints))
	for name, st := range o.endpoints {
		m[name] = st.stats
	}
	return m
}

// CredentialPeak is the most accepted requests seen in one window over all
// endpoints.
func (o *OTA) CredentialPeak() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.credential.peak
}

// Endpoints returns the documented endpoints in configuration order.
func (o *OTA) Endpoints() []Endpoint {
	o.mu.Lock()
	defer o.mu.Unlock()
	es := make([]Endpoint, 0, len(o.order))
	for _, n := range o.order {
		es = append(es, o.endpoints[n].Endpoint)
	}
	return es
}

// Arrivals returns the requests received so far, oldest first, up to the
// configured MaxLog; pass an endpoint name to keep only its requests.
func (o *OTA) Arrivals(endpoint ...string) []Arrival {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(endpoint) == 0 {
		return slices.Clone(o.log)
	}
	var out []Arrival
	for _, a := range o.log {
		if slices.Contains(endpoint, a.Endpoint) {
			out = append(out, a)
		}
	}
	return out
}

// Describe returns the documented limits as text, e.g.
// "availability 20/s, rates 5/s, reservations 10/s, credential 30/s".
func (o *OTA) Describe() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	per := "/s"
	if w := o.credential.width; w != time.Second {
		per = " per " + w.String()
	}
	var parts []string
	for _, n := range o.order {
		if l := o.endpoints[n].Limit; l > 0 {
			parts = append(parts, fmt.Sprintf("%s %d%s", n, l, per))
		}
	}
	if o.credential.limit > 0 {
		parts = append(parts, fmt.Sprintf("credential %d%s", o.credential.limit, per))
	}
	return strings.Join(parts, ", ")
}
