package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/pacer"
	"github.com/fleetrate/fleetrate/transport/internal/schedule"
)

// Defaults applied by New when an Options field is zero.
const (
	// DefaultMaxAttempts is how many times a rate-limited request is sent
	// in all, the first attempt included.
	DefaultMaxAttempts = 4
	// DefaultBackoffMin is the first retry's backoff ceiling.
	DefaultBackoffMin = 500 * time.Millisecond
	// DefaultBackoffMax caps every backoff.
	DefaultBackoffMax = 30 * time.Second
	// DefaultMaxRetryAfter caps the Retry-After the transport honours.
	DefaultMaxRetryAfter = time.Minute
	// DefaultLookahead is the default Options.Lookahead.
	DefaultLookahead = 250 * time.Millisecond
)

// storeTimeout bounds the store calls the transport makes on its own
// behalf after the caller's context may have ended: the drain after a 429
// (the fleet needs it whether or not this caller still waits) and the
// refund of a cancelled wait.
const storeTimeout = time.Second

// maxDiscard is how much of a response body the transport reads before
// closing it, so that the connection can be reused.
const maxDiscard = 64 << 10

// ErrGaveUp is the sentinel of a *GaveUpError: the upstream kept
// answering "rate limited" until the attempts ran out.
var ErrGaveUp = errors.New("transport: rate limited, gave up")

// GaveUpError is the terminal error of a request that stayed rate limited
// (429, or 503 with Retry-After) through every attempt, or whose context
// deadline left no time for the next one. It unwraps to ErrGaveUp, and to
// Cause when set, so a caller can tell it from an upstream failure, which
// is returned as the upstream's own response or error.
type GaveUpError struct {
	// Channel and Endpoint name the target that stayed limited.
	Channel, Endpoint string
	// Entity is the request's entity id, if any.
	Entity string
	// Attempts is how many times the request was sent.
	Attempts int
	// StatusCode is the last response's status: 429 or 503.
	StatusCode int
	// RetryAfter is the last usable Retry-After, after the cap; 0 when the
	// server sent none.
	RetryAfter time.Duration
	// Cause is why no further attempt was made before the attempts ran
	// out, such as context.DeadlineExceeded; nil when they ran out.
	Cause error
}

// Error says which target gave up after how many attempts.
func (e *GaveUpError) Error() string {
	s := fmt.Sprintf("transport: %s/%s: rate limited, gave up after %d attempts (last status %d", e.Channel, e.Endpoint, e.Attempts, e.StatusCode)
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(", retry-after %v", e.RetryAfter)
	}
	s += ")"
	if e.Cause != nil {
		s += ": " + e.Cause.Error()
	}
	return s
}

// Unwrap returns ErrGaveUp and Cause.
func (e *GaveUpError) Unwrap() []error {
	if e.Cause != nil {
		return []error{ErrGaveUp, e.Cause}
	}
	return []error{ErrGaveUp}
}

// CheckRetry decides after each attempt whether to retry it. resp and err
// are the base transport's answer. A non-nil error stops the request and
// is returned in place of the answer.
type CheckRetry func(ctx context.Context, resp *http.Response, err error) (bool, error)

// Backoff returns how long to sleep after failed attempt number attempt
// (1 for the first) given the configured bounds. The transport never
// sleeps less than the server's Retry-After, whatever Backoff returns.
type Backoff func(attempt int, lo, hi time.Duration) time.Duration

// IsRateLimited reports whether resp is an upstream rate limit: a 429, or a
// 503 that carries Retry-After.
func IsRateLimited(resp *http.Response) bool {
	if resp == nil {
		return false
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return true
	case http.StatusServiceUnavailable:
		return resp.Header.Get(HeaderRetryAfter) != ""
	}
	return false
}

// DefaultCheckRetry retries rate limits only (see IsRateLimited). A
// network error or any other status is an upstream failure, returned to
// the caller as is: the request may have been processed, and resending a
// booking is not safe by default.
func DefaultCheckRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if err != nil || ctx.Err() != nil {
		return false, nil
	}
	return IsRateLimited(resp), nil
}

// ExponentialJitter is the default Backoff: exponential backoff with full
// jitter, a uniformly random sleep in [0, min(hi, lo·2^(attempt-1))].
// Spreading retries over the whole range keeps workers that were limited
// together from retrying together.
func ExponentialJitter(attempt int, lo, hi time.Duration) time.Duration {
	ceil := lo
	for i := 1; i < attempt && ceil < hi; i++ {
		if ceil > hi/2 {
			ceil = hi
			break
		}
		ceil *= 2
	}
	ceil = min(ceil, hi)
	if ceil <= 0 {
		return 0
	}
	if ceil == time.Duration(1<<63-1) {
		return rand.N(ceil)
	}
	return rand.N(ceil + 1)
}

// Options configure a Transport. The zero value of each field means its
// default.
type Options struct {
	// Base sends the requests. The default is http.DefaultTransport.
	Base http.RoundTripper
	// MaxWait is the longest a request waits for the shared bucket; a
	// longer wait fails at once with an error wrapping a
	// *fleetrate.BackpressureError, and nothing is sent. A context
	// deadline that comes sooner lowers it. The default, and the most it
	// may be, is the limiter's max wait (fleetrate.DefaultMaxWait, 5 s,
	// unless configured). A request of an endpoint with a Spacing may then
	// wait for its spacing gate up to two of the gate's intervals more,
	// within MaxWait again and never past the deadline (see
	// Endpoint.Spacing).
	MaxWait time.Duration
	// MaxAttempts is how many times a rate-limited request is sent in all.
	// 1 disables retries. The default is DefaultMaxAttempts (4).
	MaxAttempts int
	// BackoffMin and BackoffMax bound the backoff between attempts. The
	// defaults are DefaultBackoffMin (500 ms) and DefaultBackoffMax (30 s).
	BackoffMin, BackoffMax time.Duration
	// MaxRetryAfter caps the Retry-After honoured, both for the fleet-wide
	// drain and for this request's own sleep. The default is
	// DefaultMaxRetryAfter (1 minute).
	MaxRetryAfter time.Duration
	// CheckRetry decides whether to retry. The default is
	// DefaultCheckRetry.
	CheckRetry CheckRetry
	// Backoff computes the sleep between attempts. The default is
	// ExponentialJitter.
	Backoff Backoff
	// Logger receives the rate_throttle_wait (debug), rate_limited and
	// rate_backpressure (warn) and rate_gave_up (error) events. The
	// default is slog.Default(); use slog.New(slog.DiscardHandler) for
	// none.
	Logger *slog.Logger
	// Registerer, when set, receives the transport's metrics (see the
	// Metric constants). Transports sharing a Registerer share them.
	Registerer prometheus.Registerer
	// FailOpen sends requests without pacing when the store is unavailable
	// (errors wrapping fleetrate.ErrStoreUnavailable) instead of failing
	// them. Either way the failure is logged as rate_store_error.
	FailOpen bool
	// Adaptive tunes adaptive pacing, which is on by default: see
	// Adaptive.
	Adaptive Adaptive
	// PauseCheckAge bounds how old this process's knowledge of the pauses
	// may be when a request that slept for its booked slot wakes: older,
	// and the request reads the pause markers once more before it sends
	// (one store call), so that a pause another process announced while
	// it slept is honoured. A transport that listens to announcements
	// (see Announcer) since the request booked reads nothing more: it
	// learns of a pause when it is announced (one store call per request).
	// Otherwise (no Announcer, or its subscription down) the default, 0,
	// reads them whenever a request slept, so that no request is sent
	// during a pause announced before it woke: such a fleet makes two
	// store calls per request. A positive value saves the second call when
	// this process read the markers (by another take) that recently, at
	// the price of sending during a pause announced in the last
	// PauseCheckAge.
	PauseCheckAge time.Duration
	// Lookahead is how far ahead a request drawing from several buckets
	// (an endpoint and its credential) may book. A booking is a point in
	// time on every bucket, so one booked ahead because its endpoint is
	// busy holds the credential idle for the other endpoints until then:
	// at most Lookahead of it. A request whose turn is further away sleeps
	// until it is within Lookahead, then books: two store calls instead of
	// one. The default is DefaultLookahead (250 ms).
	Lookahead time.Duration
	// Announcer tells the fleet of pauses and lowered rates at once (see
	// Announcer). The default is the limiter's store when it is one (a
	// redisstore.Store is), also inside a wrapper that unwraps to it (a
	// failsafe.Store). Every process of a fleet must announce: one that
	// listens trusts that a pause it was not told of did not happen, for
	// as long as its subscription is live: a redisstore.Store notices one
	// a NAT dropped silently within 2 × its Options.ListenCheck (see
	// Announcer). A transport that listens holds a connection until closed
	// (see Transport.Close).
	Announcer Announcer
}

// check checks the options against the limiter, naming the failing one.
func (o Options) check(limiter *fleetrate.Limiter) error {
	switch {
	case o.Lookahead < 0:
		return fmt.Errorf("%w: transport: lookahead must not be negative, got %v", fleetrate.ErrInvalid, o.Lookahead)
	case o.PauseCheckAge < 0:
		return fmt.Errorf("%w: transport: pause check age must not be negative, got %v", fleetrate.ErrInvalid, o.PauseCheckAge)
	case o.MaxWait < 0 || o.MaxWait > limiter.MaxWait():
		return fmt.Errorf("%w: transport: max wait must be between 0 and the limiter's max wait %v, got %v", fleetrate.ErrInvalid, limiter.MaxWait(), o.MaxWait)
	case o.MaxWait == 0 && limiter.MaxWait() > hold.MaxMarkedWait:
		return fmt.Errorf("%w: transport: max wait must be at most %v (set Options.MaxWait: the limiter's is %v)", fleetrate.ErrInvalid, hold.MaxMarkedWait, limiter.MaxWait())
	case o.MaxWait > hold.MaxMarkedWait:
		return fmt.Errorf("%w: transport: max wait must be at most %v, got %v", fleetrate.ErrInvalid, hold.MaxMarkedWait, o.MaxWait)
	case o.MaxAttempts < 0:
		return fmt.Errorf("%w: transport: max attempts must be >= 0, got %d", fleetrate.ErrInvalid, o.MaxAttempts)
	case o.BackoffMin < 0:
		return fmt.Errorf("%w: transport: backoff min must be >= 0, got %v", fleetrate.ErrInvalid, o.BackoffMin)
	case o.BackoffMax < 0:
		return fmt.Errorf("%w: transport: backoff max must be >= 0, got %v", fleetrate.ErrInvalid, o.BackoffMax)
	case o.MaxRetryAfter < 0 || o.MaxRetryAfter > fleetrate.MaxWaitCap:
		return fmt.Errorf("%w: transport: max retry-after must be between 0 and %v, got %v", fleetrate.ErrInvalid, fleetrate.MaxWaitCap, o.MaxRetryAfter)
	}
	return nil
}

// Transport is an http.RoundTripper that paces requests through shared
// fleetrate buckets and turns an upstream's 429 into a fleet-wide pause.
//
// For each request it
//  1. classifies it into a Target: the channel, endpoint and cost;
//  2. waits its turn on the endpoint bucket (and the credential bucket,
//     atomically), or fails at once with backpressure if the wait would
//     exceed the max wait;
//  3. sends it with the base transport;
//  4. on a 429 (or 503 with Retry-After) drains the endpoint bucket for
//     the Retry-After, so that no worker sharing the store sends to it
//     until then, and retries with backoff while the attempts, the body
//     and the context allow.
//
// Unlike a plain RoundTripper it returns errors for some responses: a
// request still rate limited after the last attempt fails with a
// *GaveUpError instead of returning the 429. A Transport is safe for
// concurrent use.
type Transport struct {
	base          http.RoundTripper
	lim           *fleetrate.Limiter
	classify      Classify
	maxWait       time.Duration
	maxAttempts   int
	backoffMin    time.Duration
	backoffMax    time.Duration
	maxRetryAfter time.Duration
	checkRetry    CheckRetry
	backoff       Backoff
	log           *slog.Logger
	m             *metrics
	failOpen      bool
	adaptive      Adaptive
	pauseCheckAge time.Duration
	lookahead     time.Duration
	now           func() time.Time // the clock, injected here only
	pacer         *pacer.Pacer
	pm            *permitMetrics
	headerLog     headerLog
}

var _ http.RoundTripper = (*Transport)(nil)

// New returns a Transport that paces requests through limiter's buckets,
// mapped by classify, or an error naming the invalid option.
//
// It is long because each option gets its default on a line of its own.
func New(limiter *fleetrate.Limiter, classify Classify, opts Options) (*Transport, error) {
	if limiter == nil {
		return nil, fmt.Errorf("%w: transport: limiter must not be nil", fleetrate.ErrInvalid)
	}
	if classify == nil {
		return nil, fmt.Errorf("%w: transport: classify must not be nil", fleetrate.ErrInvalid)
	}
	t := &Transport{
		base:          opts.Base,
		lim:           limiter,
		classify:      classify,
		maxWait:       opts.MaxWait,
		maxAttempts:   opts.MaxAttempts,
		backoffMin:    opts.BackoffMin,
		backoffMax:    opts.BackoffMax,
		maxRetryAfter: opts.MaxRetryAfter,
		checkRetry:    opts.CheckRetry,
		backoff:       opts.Backoff,
		log:           opts.Logger,
		failOpen:      opts.FailOpen,
		pauseCheckAge: opts.PauseCheckAge,
		now:           time.Now,
	}
	adaptive, err := opts.Adaptive.withDefaults()
	if err != nil {
		return nil, err
	}
	t.adaptive = adaptive
	t.lookahead = opts.Lookahead
	if t.lookahead == 0 {
		t.lookahead = DefaultLookahead
	}
	if err := opts.check(limiter); err != nil {
		return nil, err
	}
	if t.base == nil {
		t.base = http.DefaultTransport
	}
	if t.maxWait == 0 {
		t.maxWait = limiter.MaxWait()
	}
	if t.maxAttempts == 0 {
		t.maxAttempts = DefaultMaxAttempts
	}
	if t.backoffMin == 0 {
		t.backoffMin = DefaultBackoffMin
	}
	if t.backoffMax == 0 {
		t.backoffMax = DefaultBackoffMax
	}
	if t.backoffMax < t.backoffMin {
		return nil, fmt.Errorf("%w: transport: backoff max %v is below backoff min %v", fleetrate.ErrInvalid, t.backoffMax, t.backoffMin)
	}
	if t.maxRetryAfter == 0 {
		t.maxRetryAfter = DefaultMaxRetryAfter
	}
	if t.checkRetry == nil {
		t.checkRetry = DefaultCheckRetry
	}
	if t.backoff == nil {
		t.backoff = ExponentialJitter
	}
	if t.log == nil {
		t.log = slog.Default()
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	t.m = m
	if t.pm, err = newPermitMetrics(opts.Registerer); err != nil {
		return nil, err
	}
	t.pacer = pacer.New(pacer.Config{
		Limiter: limiter, Adaptive: !adaptive.Off, Rates: adaptive.settings(), Refresh: adaptive.Refresh,
		MaxWait: t.maxWait, Lookahead: t.lookahead, CheckAge: t.pauseCheckAge,
		BackoffMin: t.backoffMin, BackoffMax: t.backoffMax, FailOpen: t.failOpen,
		StoreTimeout: storeTimeout, Log: t.log, Events: m, Now: t.now,
	})
	if ann := announcerFor(limiter, opts.Announcer, t.log); ann != nil {
		t.pacer.Listen(ann)
	}
	return t, nil
}

// CloseIdleConnections closes the base transport's idle connections when
// it supports that, so http.Client.CloseIdleConnections reaches it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip implements http.RoundTripper; see Transport for the steps. It
// is long because the attempt loop reads best whole: wait, send, handle a
// rate limit, decide on a retry, back off.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	tg, err := t.target(req)
	if err != nil {
		closeBody(req)
		return nil, err
	}
	if tg.Bypass {
		return t.base.RoundTrip(req)
	}
	ctx := req.Context()
	attrs := tg.attrs()
	pt := tg.pace(attrs)
	// A body that cannot be rebuilt is sent once: resending a half-read
	// body would corrupt it, and a request sent with no body would be a
	// different request.
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil

	var a *Attempt                  // the attempt's booking, while its answer is out
	defer func() { a.dropHold() }() // unless the answer's body ends it
	for attempt := 1; ; attempt++ {
		var err error
		if a, err = t.book(ctx, tg, pt, attrs, attempt); err != nil {
			closeBody(req)
			return nil, err
		}
		out := req
		if attempt > 1 {
			if out, err = rewind(req); err != nil {
				return nil, fmt.Errorf("transport: %s/%s: rebuilding the body for attempt %d: %w", tg.Channel, tg.Endpoint, attempt, err)
			}
		}
		a.sent = t.now()
		resp, rterr := t.base.RoundTrip(a.h.traced(out))
		resp = a.h.answer(resp, rterr)
		li, err := a.observe(resp, rterr)
		if err != nil {
			discard(resp)
			return nil, err
		}
		nx, err := t.next(ctx, a, resp, rterr, li, replayable)
		switch {
		case err != nil:
			discard(resp)
			return nil, err
		case !nx.Retry:
			return resp, rterr
		}
		discard(resp)
		if err := schedule.Sleep(ctx, nx.After); err != nil {
			return nil, fmt.Errorf("transport: %s/%s: backing off before attempt %d: %w", tg.Channel, tg.Endpoint, nx.Attempt, err)
		}
	}
}

// target classifies req and checks the target it gets.
func (t *Transport) target(req *http.Request) (Target, error) {
	tg, err := t.classify(req)
	if err != nil {
		return tg, fmt.Errorf("transport: classifying %s %s: %w", req.Method, urlPath(req), err)
	}
	if tg.Bypass {
		return tg, nil
	}
	if costs, ok := req.Context().Value(costsKey{}).(map[string]int64); ok {
		tg.Costs = costs
	}
	if err := tg.validate(); err != nil {
		return tg, err
	}
	if tg.Entity == "" {
		tg.Entity = EntityFrom(req.Context())
	}
	return tg, nil
}

// rewind returns a copy of req with a fresh body for a retry.
func rewind(req *http.Request) (*http.Request, error) {
	out := req.Clone(req.Context())
	if req.Body == nil || req.Body == http.NoBody {
		return out, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	out.Body = body
	return out, nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

func discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDiscard)
	_ = resp.Body.Close()
}

func urlPath(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	return req.URL.Path
}

// pace returns what the pacer needs of the target, with attrs. It runs
// once per request: the buckets a 429 drains are the ones it takes unless
// the target drains its credential without taking from it (or the other
// way round), so the common case builds the names once.
func (tg Target) pace(attrs []slog.Attr) pacer.Target {
	buckets := tg.buckets()
	drained := buckets
	if tg.DrainCredential != tg.Credential || len(tg.Costs) > 0 {
		drained = tg.drained()
	}
	return pacer.Target{
		Channel: tg.Channel, Endpoint: tg.Endpoint, EndpointKey: buckets[0],
		Buckets: buckets, Drained: drained, N: tg.cost(), Costs: tg.costVector(),
		Priority: tg.Priority, Spacing: tg.Spacing, Fixed: tg.Fixed, Attrs: attrs,
	}
}

// attrs are the log attributes every event of the request carries.
func (tg Target) attrs() []slog.Attr {
	a := make([]slog.Attr, 0, 8)
	a = append(a, slog.String("channel", tg.Channel), slog.String("endpoint", tg.Endpoint))
	if tg.Entity != "" {
		a = append(a, slog.String("entity", tg.Entity))
	}
	return a
}

type entityKey struct{}

// WithEntity returns a context that carries an entity id (a property or
// hotel id) for the transport's log events of requests made with it.
func WithEntity(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, entityKey{}, id)
}

// EntityFrom returns the entity id set by WithEntity, or "".
func EntityFrom(ctx context.Context) string {
	id, _ := ctx.Value(entityKey{}).(string)
	return id
}
