package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
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
	case o.MaxWait == 0 && limiter.MaxWait() > maxMarkedWait:
		return fmt.Errorf("%w: transport: max wait must be at most %v (set Options.MaxWait: the limiter's is %v)", fleetrate.ErrInvalid, maxMarkedWait, limiter.MaxWait())
	case o.MaxWait > maxMarkedWait:
		return fmt.Errorf("%w: transport: max wait must be at most %v, got %v", fleetrate.ErrInvalid, maxMarkedWait, o.MaxWait)
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
	views         views
	ann           *listener // nil without an Announcer
	qmu           sync.Mutex
	queues        map[string]chan struct{} // see queue
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
	ann := opts.Announcer
	if ann == nil {
		var stopped fleetrate.Store
		ann, stopped = announcerOf(limiter.Store())
		if ann == nil && stopped != nil && !processLocal(stopped) {
			// A fleet whose processes do not all announce sends during
			// pauses it was not told of: never let that happen silently.
			t.log.Warn("rate_announcer_missing",
				slog.String("store", fmt.Sprintf("%T", stopped)),
				slog.String("why", "the store neither announces nor unwraps to one that does: this process will not tell the fleet of its pauses; give it an Unwrap() fleetrate.Store method or set Options.Announcer"))
		}
	}
	if ann != nil {
		t.listen(ann, limiter.Prefix())
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
	// A body that cannot be rebuilt is sent once: resending a half-read
	// body would corrupt it, and a request sent with no body would be a
	// different request.
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil

	for attempt := 1; ; attempt++ {
		began := time.Now()
		paced, err := t.wait(ctx, tg, attrs)
		if err != nil {
			if attempt == 1 {
				closeBody(req)
			}
			return nil, err
		}
		out := req
		if attempt > 1 {
			t.m.retried(tg)
			if out, err = rewind(req); err != nil {
				return nil, fmt.Errorf("transport: %s/%s: rebuilding the body for attempt %d: %w", tg.Channel, tg.Endpoint, attempt, err)
			}
		}
		var gate gatePass
		if tg.Spacing > 0 && paced {
			if gate, err = t.passGate(ctx, tg, t.budget(ctx)-time.Since(began)); err != nil {
				if err = t.waitFailed(ctx, tg, attrs, err); err != nil {
					closeBody(out)
					return nil, err
				}
			}
		}
		sent := time.Now()
		resp, err := t.base.RoundTrip(out)

		var li limitInfo
		switch {
		case err == nil && IsRateLimited(resp):
			if li, err = t.onLimited(ctx, tg, resp, sent, attempt, attrs); err != nil {
				discard(resp)
				return nil, err
			}
		case err == nil:
			t.admitted(tg)
			if gate.passed {
				// A 429 may come back sooner than an answer, and its
				// pause holds the fleet anyway: only answers count.
				t.answered(ctx, tg, attrs, gate, sent, time.Since(sent))
			}
		}

		retry, cerr := t.checkRetry(ctx, resp, err)
		switch {
		case cerr != nil:
			if resp != nil {
				discard(resp)
			}
			return nil, cerr
		case !retry:
			return resp, err
		case !replayable:
			// The caller gets the upstream's answer unchanged: the body
			// is gone, so no retry can be sent.
			return resp, err
		}
		if attempt >= t.maxAttempts {
			if li.limited {
				return nil, t.gaveUp(ctx, tg, attrs, attempt, resp, li, nil)
			}
			return resp, err
		}

		if err := t.backOff(ctx, tg, attrs, attempt, resp, li); err != nil {
			return nil, err
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
	if err := tg.validate(); err != nil {
		return tg, err
	}
	if tg.Entity == "" {
		tg.Entity = EntityFrom(req.Context())
	}
	return tg, nil
}

// backOff sleeps before the attempt after attempt: the backoff, and never
// less than the pause a rate limit set. When ctx's deadline leaves no time
// for the next attempt, it gives up at once rather than sleep into it.
func (t *Transport) backOff(ctx context.Context, tg Target, attrs []slog.Attr, attempt int, resp *http.Response, li limitInfo) error {
	delay := max(t.backoff(attempt, t.backoffMin, t.backoffMax), li.pause)
	if dl, ok := ctx.Deadline(); ok && li.limited && time.Until(dl) < delay {
		return t.gaveUp(ctx, tg, attrs, attempt, resp, li, context.DeadlineExceeded)
	}
	if resp != nil {
		discard(resp)
	}
	if err := sleep(ctx, delay); err != nil {
		return fmt.Errorf("transport: %s/%s: backing off before attempt %d: %w", tg.Channel, tg.Endpoint, attempt+1, err)
	}
	return nil
}

// limitInfo is what a rate-limited answer told the transport.
type limitInfo struct {
	limited           bool
	retryAfter, pause time.Duration
	atFloor           bool // the rate was at its floor already
}

// onLimited handles a 429 (or 503 with Retry-After) to a request sent at
// sent: every rate limit pauses the fleet (without a usable Retry-After,
// for the backoff of this attempt) and lowers the rate (see drain).
func (t *Transport) onLimited(ctx context.Context, tg Target, resp *http.Response, sent time.Time, attempt int, attrs []slog.Attr) (limitInfo, error) {
	ra, ok := ParseRetryAfter(resp.Header.Get(HeaderRetryAfter), time.Now(), t.maxRetryAfter)
	lim := limited{sent: sent, soon: t.limitedAtOnce(tg, sent)}
	li := limitInfo{limited: true, retryAfter: ra, pause: t.pauseFor(ra, tg, lim)}
	t.m.rateLimited(tg, resp.StatusCode)
	t.log.LogAttrs(ctx, slog.LevelWarn, "rate_limited", append(attrs,
		slog.Int("status", resp.StatusCode),
		slog.String("retry_after", resp.Header.Get(HeaderRetryAfter)),
		slog.Bool("retry_after_valid", ok),
		slog.Int64("pause_ms", li.pause.Milliseconds()),
		slog.Int("attempt", attempt))...)
	var err error
	li.atFloor, err = t.drain(ctx, tg, li.pause, lim, attrs)
	return li, err
}

// gaveUp ends a request still rate limited after attempt attempts.
func (t *Transport) gaveUp(ctx context.Context, tg Target, attrs []slog.Attr, attempt int, resp *http.Response, li limitInfo, cause error) error {
	if cause == nil && li.atFloor {
		cause = ErrPersistentLimit
	}
	t.m.gaveUpOn(tg)
	t.log.LogAttrs(ctx, slog.LevelError, "rate_gave_up", append(attrs,
		slog.Int("attempts", attempt),
		slog.Int("status", resp.StatusCode))...)
	discard(resp)
	return &GaveUpError{Channel: tg.Channel, Endpoint: tg.Endpoint, Entity: tg.Entity,
		Attempts: attempt, StatusCode: resp.StatusCode, RetryAfter: li.retryAfter, Cause: cause}
}

// wait takes the request's turn on its buckets, within the max wait from
// its start (lowered by ctx's deadline), and returns when it may be sent.
// A wait known to exceed that fails at once with backpressure.
//
// A request is: book, sleep, send. The booking is one atomic take, through
// the Limiter (fleetrate.Limiter.Book), of the request's buckets at their
// effective (adapted) rates and of their markers (see adaptive.go): a pause
// drained into a marker books the take after the pause, so requests queue
// behind it in booking order without polling, and the take's booking tells
// this process the pauses and, every Adaptive.Refresh, the rates of the
// buckets. The request then sleeps until its slot.
//
// A request drawing from several buckets (an endpoint and its credential)
// books them all in that one take too, but waits first for the requests of
// this process that draw from the same buckets and booked before it (see
// queue): a booking is a point in time on every bucket, and a token bucket
// cannot leave a hole before it, so a fleet that booked a slow endpoint far
// ahead would idle the credential for every other endpoint until then.
// With one booking per process ahead, a credential waits for no more than
// the fleet's processes' next slots on an endpoint.
//
// A request that wakes inside a pause announced after it booked gives its
// booking back and queues again behind the pause: nothing is sent during a
// pause this process knows of. It knows of a pause from its own 429s (at
// once), from its takes, from announcements (see Announcer), and otherwise
// by reading the markers once more before it sends (see PauseCheckAge).
//
// It reports paced false when the store failed and the request goes
// unpaced (Options.FailOpen).
func (t *Transport) wait(ctx context.Context, tg Target, attrs []slog.Attr) (paced bool, err error) {
	names := tg.buckets()
	w := &waiter{t: t, tg: tg, attrs: attrs, n: tg.cost(), paced: make([]fleetrate.Bucket, len(names))}
	for i, name := range names {
		b, err := t.lim.Bucket(name)
		if err != nil {
			return false, fmt.Errorf("transport: %s/%s: %w", tg.Channel, tg.Endpoint, err)
		}
		w.paced[i] = b
	}
	class := fleetrate.PriorityFrom(ctx)
	if class == "" && tg.Priority != "" {
		class = tg.Priority
		ctx = fleetrate.WithPriority(ctx, class)
	}
	w.ctx, w.start, w.maxWait = ctx, time.Now(), t.budget(ctx)
	if len(w.paced) > 1 {
		release, err := t.queue(ctx, strings.Join(append(names, class), "\x00"), w.start, w.maxWait)
		if err != nil {
			if errors.Is(err, errQueueBudget) {
				return false, w.backpressure(w.maxWait, fleetrate.Result{})
			}
			return false, w.failed("waiting for the bucket", err)
		}
		// The next request of this process may book once this one's slot
		// has come (or its wait has failed).
		defer release()
	}
	for {
		if err := ctx.Err(); err != nil {
			return false, w.failed("waiting for the bucket", err)
		}
		again, err := w.outsidePause()
		if err != nil || again {
			if err != nil {
				return false, err
			}
			continue
		}
		r, tk, err := w.book()
		switch {
		case errors.Is(err, errFailedOpen):
			return false, nil // the store failed: send unpaced (Options.FailOpen)
		case err != nil:
			return false, err
		case r == nil:
			continue
		}
		if again, err = w.sleep(r, tk); err != nil {
			return false, err
		}
		if !again {
			t.waited(ctx, tg, attrs, time.Since(w.start))
			return true, nil
		}
	}
}

// budget returns how long a request may wait for its turn: the max wait,
// or less when ctx ends sooner.
func (t *Transport) budget(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(min(t.maxWait, time.Until(dl)), 0)
	}
	return t.maxWait
}

// errFailedOpen is book's report of a failed store when failing open.
var errFailedOpen = errors.New("transport: store unavailable, failing open")

// waiter is one request's wait: its buckets, its budget and how its
// failures read.
type waiter struct {
	t       *Transport
	ctx     context.Context
	tg      Target
	attrs   []slog.Attr
	n       int64
	paced   []fleetrate.Bucket
	start   time.Time
	maxWait time.Duration
	// lateAnswer is set once a booking whose slot had begun before its
	// answer came was booked again for lateness: from then on, such a
	// booking's lateness counts from its answer, so that a slow round
	// trip to an idle bucket does not book it again and again.
	lateAnswer bool
}

// resumeLead is how long before a pause this process knows of ends its
// waiting requests book. The pause drained the buckets until its end, so
// their slots still begin at the end at the earliest; booked that early,
// the answers come before the slots do, and the first requests after the
// pause go out on time rather than as late answers of a fleet that woke
// and booked at once (whose first request would go out late, and the
// next on its slot: too close to it for a strict window).
const resumeLead = 100 * time.Millisecond

// outsidePause sits out a pause this process knows of (its own 429 sets
// it before the drain returns), or fails at once when the pause, or the
// queue this process's last booking left, outlasts the budget. It reports
// whether it slept (the caller then looks again).
func (w *waiter) outsidePause() (slept bool, err error) {
	if until, _ := w.t.pausedUntil(w.paced, time.Time{}); until.After(time.Now().Add(resumeLead)) {
		// Book resumeLead before the pause ends: the drained bucket gives
		// the first slot at its end, and its answer comes before it.
		if err := w.sitOut(until, resumeLead); err != nil {
			return false, err
		}
		return true, nil
	}
	if d := time.Until(w.t.nextFree(w.paced)); d > w.remaining() {
		// This process's last booking already queued the buckets past the
		// budget: no need to ask the store to say so.
		return false, w.backpressure(d, fleetrate.Result{})
	}
	return false, nil
}

// sitOut sleeps until lead before until, the end of a pause this process
// knows of, or fails at once with backpressure when the pause outlasts
// the wait budget.
func (w *waiter) sitOut(until time.Time, lead time.Duration) error {
	d := time.Until(until)
	if d > w.remaining() {
		return w.backpressure(d, fleetrate.Result{})
	}
	if err := sleep(w.ctx, d-lead); err != nil {
		return w.failed("waiting out a pause", err)
	}
	return nil
}

// book books the request's turn (see Transport.wait). It returns
// errFailedOpen when the store failed and the transport fails open, and no
// reservation and no error when the caller should look again: a
// multi-bucket turn was beyond the look-ahead and has come nearer, or the
// booking was behind a pause this process did not know of.
func (w *waiter) book() (*fleetrate.Reservation, take, error) {
	t := w.t
	tk := t.layout(w.ctx, w.tg, w.paced)
	horizon := w.remaining()
	if len(w.paced) > 1 {
		horizon = min(horizon, t.lookahead)
	}
	r, err := t.lim.Book(w.ctx, fleetrate.Request{Buckets: tk.buckets, N: w.n, MaxWait: horizon})
	if err != nil {
		var bp *fleetrate.BackpressureError
		if !errors.As(err, &bp) {
			if err := t.waitFailed(w.ctx, w.tg, w.attrs, err); err != nil {
				return nil, tk, err
			}
			return nil, tk, errFailedOpen
		}
		if len(w.paced) == 1 {
			t.learnNext(w.paced[0].Key, time.Now().Add(bp.RetryAfter))
		}
		if bp.RetryAfter > w.remaining() || bp.MaxWait < horizon {
			// Beyond the budget (or the horizon of the request's priority
			// class): say so at once.
			return nil, tk, w.backpressure(bp.RetryAfter, bp.Result)
		}
		// A multi-bucket turn beyond the look-ahead: sleep until it is
		// within it, then book.
		if err := sleep(w.ctx, bp.RetryAfter-horizon); err != nil {
			return nil, tk, w.failed("waiting for the bucket", err)
		}
		return nil, tk, nil
	}
	if t.learn(tk, r.Booking(), time.Now()) && !t.adaptive.Off && !w.tg.Fixed {
		// Booked behind a pause this process did not know of, at a rate
		// the 429 behind it may have lowered: give the booking back, read
		// the rate, book again.
		w.cancel(r)
		return nil, tk, nil
	}
	return r, tk, nil
}

// sleep sleeps until the booked slot, then checks that it still holds. It
// reports whether the booking was void (given back: the caller books
// again).
//
// The markers' store read (see PauseCheckAge) happens before the slot
// when the request wakes early for it (see sleepUntil), so that its round
// trip does not make the request late; the lateness check (spread) comes
// after everything but the send.
func (w *waiter) sleep(r *fleetrate.Reservation, tk take) (void bool, err error) {
	t := w.t
	booked := time.Now()
	woke := w.sleepUntil(r.Due(), spinLead(tk.buckets[:tk.paced]))
	if woke {
		if void, err := w.checkPauses(r, tk, booked); err != nil || void {
			return void, err
		}
		w.spin(r.Due())
	}
	if err := r.Sleep(w.ctx); err != nil {
		// Sleep gave the booking back: only what no later booking relies
		// on returns, and nothing while a 429's drain has moved the bucket
		// on, so a cancel never shortens a pause or grants a slot twice.
		var bp *fleetrate.BackpressureError
		if errors.As(err, &bp) {
			return false, w.backpressure(bp.RetryAfter, bp.Result)
		}
		return false, w.failed("waiting for the bucket", err)
	}
	if !woke { // else read before the spin
		if void, err := w.checkPauses(r, tk, booked); err != nil || void {
			return void, err
		}
	}
	// A request woken well after its slot (a stalled process: CPU
	// starvation, a GC pause) would go out together with the other overdue
	// requests of its process, or too close to the next slot's, whichever
	// process holds it: a burst the upstream sees. So would one whose
	// booking's answer came back late (at a fleet's start, the first
	// requests book at once and the next slots follow theirs). Booking
	// again gives such a request a later slot when others were booked
	// behind it, or the same late answer when none were: it is booked
	// again once at most (see waiter.lateAnswer).
	due := r.Due()
	begunBefore := !due.After(booked) // the slot had begun before the answer came
	if begunBefore && w.lateAnswer {
		due = booked
	}
	d, void := t.spread(tk, due, time.Now())
	switch {
	case void:
		w.lateAnswer = w.lateAnswer || begunBefore
		t.m.rebooked(w.tg)
		w.cancel(r)
		return true, nil
	case d > 0:
		if err := sleep(w.ctx, d); err != nil {
			w.cancel(r)
			return false, w.failed("spacing a late request", err)
		}
	}
	if until, _ := t.pausedUntil(w.paced, time.Time{}); until.After(time.Now()) || t.pausedSince(w.paced, booked) {
		// Paused, or a pause began after this booking: the 429 that drew
		// it voided every booking made before it (see drain), so book
		// again behind it, at the rate it may have lowered. A slot that
		// came before the end of a pause this process knows of (booked
		// resumeLead ahead, on a clock a little off the store's) books
		// again once the pause is over, not at once.
		w.cancel(r)
		if until.After(time.Now()) {
			if err := w.sitOut(until, 0); err != nil {
				return false, err
			}
		}
		return true, nil
	}
	return false, nil
}

// checkPauses reads the buckets' pause markers once more, when the request
// slept on its booking and this process has not read them within
// PauseCheckAge nor listens to announcements since it booked: a pause
// drained after the booking voids it (given back: the caller books again).
func (w *waiter) checkPauses(r *fleetrate.Reservation, tk take, booked time.Time) (void bool, err error) {
	t := w.t
	slept := r.Result.Wait > 0
	if _, fresh := t.pausedUntil(w.paced, time.Now().Add(-t.pauseCheckAge)); !slept || fresh || t.listening(booked) {
		return false, nil
	}
	drained, err := t.readPauses(w.ctx, tk, r.Booking())
	if err != nil {
		w.cancel(r)
		return false, t.waitFailed(w.ctx, w.tg, w.attrs, err)
	}
	if drained {
		w.cancel(r)
		return true, nil
	}
	return false, nil
}

// sleepUntil sleeps until lead before due, when the request's buckets
// tolerate little send jitter (lead, from spinLead, is above 0): Go's
// timers wake a sleeper up to about 1 ms late (the runtime's poller sleeps
// in whole milliseconds), which is a third of the margin of a fleet paced
// at 95 % of a strict burst-1 window, so such a request wakes early and
// waits out the rest in spin. It reports whether it woke so; otherwise
// (no lead, a slot past the context's deadline, a context that ended) it
// leaves the wait, the deadline and a cancel to Reservation.Sleep.
func (w *waiter) sleepUntil(due time.Time, lead time.Duration) bool {
	if lead <= 0 {
		return false
	}
	if dl, ok := w.ctx.Deadline(); ok && due.After(dl) {
		return false // past the deadline: Reservation.Sleep says so at once
	}
	if d := time.Until(due) - lead; d > 0 {
		if sleep(w.ctx, d) != nil {
			return false // cancelled: Reservation.Sleep gives the booking back
		}
	}
	return w.ctx.Err() == nil
}

// spin yields the processor until due comes.
func (w *waiter) spin(due time.Time) {
	var last time.Time
	for w.ctx.Err() == nil {
		now := time.Now()
		if !now.Before(due) || now.Equal(last) {
			// Due, or a clock that stood still while this goroutine ran
			// (a coarse clock source, or testing/synctest's, which moves
			// only when every goroutine blocks): the timer does the rest.
			return
		}
		last = now
		runtime.Gosched()
	}
}

// remaining returns what is left of the wait budget.
func (w *waiter) remaining() time.Duration {
	return max(w.maxWait-time.Since(w.start), 0)
}

// backpressure fails the wait: it would last retryAfter. The error
// reports the wait budget that was left, not the whole max wait: that is
// what the wait exceeded.
func (w *waiter) backpressure(retryAfter time.Duration, res fleetrate.Result) error {
	return w.t.waitFailed(w.ctx, w.tg, w.attrs, &fleetrate.BackpressureError{RetryAfter: retryAfter, MaxWait: w.remaining(), Result: res})
}

func (w *waiter) failed(what string, err error) error {
	return fmt.Errorf("transport: %s/%s: %s: %w", w.tg.Channel, w.tg.Endpoint, what, err)
}

// cancel gives a booking back, best effort, even once the request's
// context has ended.
func (w *waiter) cancel(r *fleetrate.Reservation) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), storeTimeout)
	defer cancel()
	_ = r.Cancel(rctx)
}

// errQueueBudget is queue's error for a request whose wait budget ran out
// while it queued in its process.
var errQueueBudget = errors.New("transport: wait budget spent in the process's queue")

// queue waits for the request's turn among this process's requests with
// the same key (in arrival order: a channel's waiting senders are served
// first in, first out), within the wait budget, and returns the function
// that lets the next one go.
func (t *Transport) queue(ctx context.Context, key string, start time.Time, maxWait time.Duration) (release func(), err error) {
	t.qmu.Lock()
	if t.queues == nil {
		t.queues = map[string]chan struct{}{}
	}
	q := t.queues[key]
	if q == nil {
		q = make(chan struct{}, 1)
		t.queues[key] = q
	}
	t.qmu.Unlock()
	timer := time.NewTimer(max(maxWait-time.Since(start), 0))
	defer timer.Stop()
	select {
	case q <- struct{}{}:
		var once sync.Once
		return func() { once.Do(func() { <-q }) }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-timer.C:
		return nil, errQueueBudget
	}
}

// readPauses reads the pause markers of the take's paced buckets (one
// peek) into this process's views, and reports whether a 429 drained them
// since the take booked bk, voiding the booking (see drain). A drain
// leaves a marker's debt at least markerFill past the drain, while takes
// only move it past their slots (at most the max wait ahead) by a
// nanosecond each: so, on the store's clock, a marker whose debt now ends
// past both the booking's time + markerFill and what the booking left it
// was drained since.
func (t *Transport) readPauses(ctx context.Context, tk take, bk fleetrate.Booking) (drained bool, err error) {
	paced := tk.buckets[:tk.paced]
	res, err := t.lim.Store().Take(ctx, fleetrate.Request{Buckets: tk.buckets[tk.paced:]})
	if err != nil {
		return false, err
	}
	now := time.Now()
	if !res.At.IsZero() && bk.Stamp > 0 && len(bk.Debts) >= tk.paced {
		booked := time.UnixMicro(bk.Stamp)
		left := booked.Add(markerFill)
		for _, d := range bk.Debts[len(bk.Debts)-tk.paced:] {
			left = later(left, booked.Add(time.Duration(d)+time.Millisecond))
		}
		drained = !res.At.Add(res.ResetAfter).Before(left)
	}
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	for _, b := range paced {
		v := t.views.get(b.Key)
		if !res.Allowed {
			t.learnPause(v, b.Key, now.Add(res.RetryAfter))
		}
		v.seen = now
		if drained {
			v.read = time.Time{} // the 429 may have lowered the rate
		}
	}
	return drained, nil
}

// waited records a granted wait.
func (t *Transport) waited(ctx context.Context, tg Target, attrs []slog.Attr, d time.Duration) {
	t.m.waited(tg, d)
	if d > 0 {
		t.log.LogAttrs(ctx, slog.LevelDebug, "rate_throttle_wait", append(attrs, slog.Int64("wait_ms", d.Milliseconds()))...)
	}
}

// waitFailed turns a failed take into the request's error: backpressure,
// a store failure (nil when failing open) or an invalid configuration.
func (t *Transport) waitFailed(ctx context.Context, tg Target, attrs []slog.Attr, err error) error {
	var bp *fleetrate.BackpressureError
	switch {
	case errors.As(err, &bp):
		t.m.backpressured(tg)
		t.log.LogAttrs(ctx, slog.LevelWarn, "rate_backpressure", append(attrs,
			slog.Int64("retry_after_ms", bp.RetryAfter.Milliseconds()),
			slog.Int64("max_wait_ms", bp.MaxWait.Milliseconds()))...)
	case errors.Is(err, fleetrate.ErrStoreUnavailable):
		t.log.LogAttrs(ctx, slog.LevelError, "rate_store_error", append(attrs,
			slog.String("error", err.Error()), slog.Bool("fail_open", t.failOpen))...)
		if t.failOpen {
			return nil
		}
	}
	return fmt.Errorf("transport: %s/%s: %w", tg.Channel, tg.Endpoint, err)
}

// drain pauses the target's buckets and their pause markers for d across
// the fleet (see Target.drained), after pausing this process's own
// requests at once, and lowers their effective rates (see decrease) for
// the 429 lim, before the pause is visible to the fleet,
// so that a process that learns of the pause reads the lowered rate. It
// runs even if the caller's context has ended, since the whole fleet needs
// it. It reports whether a bucket was at its floor rate already.
func (t *Transport) drain(ctx context.Context, tg Target, d time.Duration, lim limited, attrs []slog.Attr) (atFloor bool, err error) {
	names := tg.drained()
	paced := make([]fleetrate.Bucket, len(names))
	keys := make([]string, len(names))
	for i, name := range names {
		b, err := t.lim.Bucket(name)
		if err != nil {
			return false, fmt.Errorf("transport: %s/%s: %w", tg.Channel, tg.Endpoint, err)
		}
		paced[i], keys[i] = b, b.Key
	}
	resume := time.Now().Add(d)
	resumed := t.pauseLocally(keys, resume)
	atFloor = t.decrease(ctx, tg, paced, lim, resume, resumed, attrs)
	// The buckets at their effective limits, and their pause markers.
	// The markers first: from then on every take waits out the pause.
	// Then the buckets start again from the pause, empty: the slots booked
	// before the 429, at the rate that drew it, are void (each waiter
	// books again behind the pause when it learns of it).
	bs := t.layout(ctx, tg, paced).buckets
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	store := t.lim.Store()
	err = store.Drain(dctx, bs[len(paced):], d)
	if err == nil {
		skeys := make([]string, len(paced))
		for i, b := range paced {
			skeys[i] = b.StoreKey()
		}
		err = store.Reset(dctx, skeys...)
	}
	if err == nil {
		err = store.Drain(dctx, bs[:len(paced)], d)
	}
	if err == nil {
		for _, b := range paced {
			t.announcePause(ctx, b, d)
		}
		return atFloor, nil
	}
	if errors.Is(err, fleetrate.ErrStoreUnavailable) && t.failOpen {
		t.log.LogAttrs(ctx, slog.LevelError, "rate_store_error", append(attrs,
			slog.String("error", err.Error()), slog.Bool("fail_open", true))...)
		return atFloor, nil
	}
	return atFloor, fmt.Errorf("transport: %s/%s: draining after a rate limit: %w", tg.Channel, tg.Endpoint, err)
}

// limited is a rate limit on a request: when the request was sent, and
// whether it came at once after the fleet's last pause (decided once, by
// limitedAtOnce, for both the pause and the rate).
type limited struct {
	sent time.Time
	soon bool
}

// limitedAtOnce reports whether a rate limit on tg's request sent at sent
// came before the second slot after the fleet's last pause of tg's
// endpoint, at the effective rate (see limitRange): then the pause was too
// short, and the rate is not to blame.
func (t *Transport) limitedAtOnce(tg Target, sent time.Time) bool {
	key := EndpointBucket(tg.Channel, tg.Endpoint)
	b, err := t.lim.Bucket(key)
	if err != nil {
		return false
	}
	rate := paceRate(b)
	now := time.Now()
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	v := t.views.get(key)
	if !t.adaptive.Off && !tg.Fixed {
		rate *= t.adaptive.factor(v.climb, now)
	}
	_, _, soon := limitRange(1, rate, sent, v.pauseUntil)
	return soon
}

// pauseFor returns how long the rate limit lim pauses the fleet: the
// Retry-After when the upstream sent a usable one. Without one, as long as
// the fleet's longest pause (at first the backoff's floor), and twice that
// (up to the backoff's ceiling) when the limit came at once after that
// pause: an upstream that limits the first request after a pause has a
// longer pause of its own.
func (t *Transport) pauseFor(retryAfter time.Duration, tg Target, lim limited) time.Duration {
	if retryAfter > 0 {
		return retryAfter
	}
	t.views.mu.Lock()
	defer t.views.mu.Unlock()
	v := t.views.get(EndpointBucket(tg.Channel, tg.Endpoint))
	d := min(max(t.backoffMin, v.lastPause), t.backoffMax)
	if lim.soon && v.lastPause > 0 {
		d = min(2*v.lastPause, t.backoffMax)
	}
	v.lastPause = d
	return d
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

// sleep waits d or until ctx ends, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

func discard(resp *http.Response) {
	_, _ = io.CopyN(io.Discard, resp.Body, maxDiscard)
	_ = resp.Body.Close()
}

func urlPath(req *http.Request) string {
	if req.URL == nil {
		return ""
	}
	return req.URL.Path
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
