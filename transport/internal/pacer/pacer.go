// Package pacer wires the outbound transport's concepts together for one
// transport: it keeps what this process knows of each bucket it paces
// (one value per concept: its hold, its rate controller's state, its send
// history) and runs a request's turn through them.
//
//   - schedule: a request's turn (Pacer.Wait runs a schedule.Request over
//     this process's knowledge);
//   - hold: the fleet's pause after a 429 (Pacer.Limited drains it) and
//     the spacing gate's hold (Pacer.PassGate, Pacer.Answered);
//   - ratecontrol: the effective rate (Pacer.Limited feeds it evidence,
//     and takes are laid out at its factor);
//   - sendtime: when a request whose slot came goes out;
//   - notice: announcements heard and made;
//   - ratelimitheader: what an answer's rate-limit fields say (Pacer.Stated
//     caps the rate at a stated limit and holds the buckets when too little
//     remains).
//
// The transport's public package keeps the API, the attempt loop and the
// metrics; it reaches the concepts only through a Pacer.
package pacer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/notice"
	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
	"github.com/fleetrate/fleetrate/transport/internal/schedule"
)

// Events receives what a pacer counts, labelled by channel and endpoint:
// the transport's metrics.
type Events interface {
	Waited(channel, endpoint string, d time.Duration)
	Backpressured(channel, endpoint string)
	EffectiveRate(channel, endpoint, bucket string, rate float64)
	Persistent(channel, endpoint string)
	Rebooked(channel, endpoint string)
	SpacingHeld(channel, endpoint string)
	// HeaderHeld counts a hold taken from an answer's rate-limit fields
	// (see Pacer.Stated).
	HeaderHeld(channel, endpoint string)
}

// Config is a pacer's settings, checked and defaulted by the transport.
type Config struct {
	Limiter *fleetrate.Limiter
	// Adaptive turns adaptive pacing on; Rates are the controller's
	// settings and Refresh how often a process reads a bucket's climb.
	Adaptive bool
	Rates    ratecontrol.Settings
	Refresh  time.Duration
	// MaxWait, Lookahead and CheckAge: see transport.Options.
	MaxWait, Lookahead, CheckAge time.Duration
	// BackoffMin and BackoffMax bound a pause without a Retry-After.
	BackoffMin, BackoffMax time.Duration
	// FailOpen sends unpaced when the store is unavailable.
	FailOpen bool
	// StoreTimeout bounds the calls made after a caller may have left.
	StoreTimeout time.Duration
	Log          *slog.Logger
	Events       Events
	// Now is the clock.
	Now func() time.Time
}

// Target is what a pacer needs of a request's target.
type Target struct {
	Channel, Endpoint string
	// EndpointKey names the endpoint's bucket.
	EndpointKey string
	// Buckets are the buckets a request takes, Drained those a 429
	// pauses; the two may share an array, and neither is written to.
	// (Buckets[0] is the endpoint's.)
	Buckets, Drained []string
	N                int64
	// Costs, when set, are the cost of each of Buckets, in its order,
	// instead of N from each.
	Costs    []int64
	Priority string
	Spacing  time.Duration
	// Fixed turns adaptive pacing off for this target.
	Fixed bool
	// Attrs are the log attributes of the request's events.
	Attrs []slog.Attr
}

// Pacer is one transport's pacing. It is safe for concurrent use.
type Pacer struct {
	cfg    Config
	known  knowledge
	ann    *notice.Listener // nil without an Announcer
	queues schedule.Queues
}

// New returns a pacer with cfg.
func New(cfg Config) *Pacer {
	return &Pacer{cfg: cfg}
}

// Listen starts listening to a for the limiter's announcements.
func (p *Pacer) Listen(a notice.Announcer) {
	p.ann = notice.Listen(a, notice.ListenOptions{Prefix: p.cfg.Limiter.Prefix(), Log: p.cfg.Log, Now: p.cfg.Now, Timeout: p.cfg.StoreTimeout}, p.heard)
}

// Close stops listening for announcements.
func (p *Pacer) Close() { p.ann.Close() }

// adapts reports whether tg's rate adapts to 429s: the one place where
// fixed and adaptive pacing part.
func (p *Pacer) adapts(tg Target) bool { return p.cfg.Adaptive && !tg.Fixed }

// Budget returns how long a request may wait for its turn: the max wait,
// or less when ctx ends sooner or carries a shorter one (WithMaxWait).
func (p *Pacer) Budget(ctx context.Context) time.Duration {
	b := p.cfg.MaxWait
	if d, ok := ctx.Value(maxWaitKey{}).(time.Duration); ok {
		b = min(b, max(d, 0))
	}
	if dl, ok := ctx.Deadline(); ok {
		return max(min(b, dl.Sub(p.cfg.Now())), 0)
	}
	return b
}

type maxWaitKey struct{}

// WithMaxWait returns a context whose requests wait at most d for their
// turn (never more than the pacer's max wait).
func WithMaxWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, maxWaitKey{}, d)
}

// Wait takes the request's turn on its buckets, within the max wait from
// its start (lowered by ctx's deadline), and returns when it may be sent;
// a wait known to exceed that fails at once with backpressure. The turn is
// the schedule's (package schedule): book one atomic take of the buckets
// at their effective rates and of their pause markers through the
// Limiter, sleep until the slot, verify it still holds, send.
//
// A request drawing from several buckets (an endpoint and its credential)
// first waits for the requests of this process that draw from the same
// buckets and booked before it (see schedule.Queues).
//
// It reports paced false when the store failed and the request goes
// unpaced (Config.FailOpen); else r is the booking the request goes out
// on, which holds its in-flight permit when a bucket bounds them.
func (p *Pacer) Wait(ctx context.Context, tg Target) (r *fleetrate.Reservation, paced bool, err error) {
	q := &schedule.Request{
		Name:      tg.Channel + "/" + tg.Endpoint,
		Fleet:     fleet{p: p, tg: tg},
		Limiter:   p.cfg.Limiter,
		Paced:     make([]fleetrate.Bucket, len(tg.Buckets)),
		N:         tg.N,
		Costs:     tg.Costs,
		Lookahead: p.cfg.Lookahead,
		CheckAge:  p.cfg.CheckAge,
		Now:       p.cfg.Now,
		Rebooked:  func() { p.cfg.Events.Rebooked(tg.Channel, tg.Endpoint) },
		GiveBack:  p.cfg.StoreTimeout,
	}
	for i, name := range tg.Buckets {
		b, err := p.cfg.Limiter.Bucket(name)
		if err != nil {
			return nil, false, fmt.Errorf("transport: %s: %w", q.Name, err)
		}
		q.Paced[i] = b
	}
	class := fleetrate.PriorityFrom(ctx)
	if class == "" && tg.Priority != "" {
		class = tg.Priority
		ctx = fleetrate.WithPriority(ctx, class)
	}
	q.Failed = func(err error) error { return p.WaitFailed(ctx, tg, err) }
	q.Start, q.MaxWait = p.cfg.Now(), p.Budget(ctx)
	if len(q.Paced) > 1 {
		release, err := p.queues.Wait(ctx, strings.Join(tg.Buckets, "\x00")+"\x00"+class, q.MaxWait)
		switch {
		case errors.Is(err, schedule.ErrQueueBudget):
			return nil, false, q.Failed(&fleetrate.BackpressureError{RetryAfter: q.MaxWait, MaxWait: q.Remaining()})
		case err != nil:
			return nil, false, fmt.Errorf("transport: %s: waiting for the bucket: %w", q.Name, err)
		}
		// The next request of this process may book once this one's slot
		// has come (or its wait has failed).
		defer release()
	}
	switch err := q.Wait(ctx); {
	case errors.Is(err, schedule.ErrFailedOpen):
		return nil, false, nil // the store failed: send unpaced (Config.FailOpen)
	case err != nil:
		return nil, false, err
	}
	d := p.cfg.Now().Sub(q.Start)
	p.cfg.Events.Waited(tg.Channel, tg.Endpoint, d)
	if d > 0 {
		p.cfg.Log.LogAttrs(ctx, slog.LevelDebug, "rate_throttle_wait", append(tg.Attrs, slog.Int64("wait_ms", d.Milliseconds()))...)
	}
	return q.Granted, true, nil
}

// WaitFailed turns a failed take into the request's error: backpressure,
// a store failure (nil when failing open) or an invalid configuration.
func (p *Pacer) WaitFailed(ctx context.Context, tg Target, err error) error {
	var bp *fleetrate.BackpressureError
	switch {
	case errors.As(err, &bp):
		p.cfg.Events.Backpressured(tg.Channel, tg.Endpoint)
		p.cfg.Log.LogAttrs(ctx, slog.LevelWarn, "rate_backpressure", append(tg.Attrs,
			slog.Int64("retry_after_ms", bp.RetryAfter.Milliseconds()),
			slog.Int64("max_wait_ms", bp.MaxWait.Milliseconds()))...)
	case errors.Is(err, fleetrate.ErrStoreUnavailable):
		p.cfg.Log.LogAttrs(ctx, slog.LevelError, "rate_store_error", append(tg.Attrs,
			slog.String("error", err.Error()), slog.Bool("fail_open", p.cfg.FailOpen))...)
		if p.cfg.FailOpen {
			return nil
		}
	}
	return fmt.Errorf("transport: %s/%s: %w", tg.Channel, tg.Endpoint, err)
}

// heard applies an announcement to this process's knowledge.
func (p *Pacer) heard(m notice.Message) {
	now := p.cfg.Now()
	p.known.mu.Lock()
	defer p.known.mu.Unlock()
	v := p.known.get(m.Key)
	switch m.Kind {
	case notice.Pause:
		p.learnPause(v, m.Key, now.Add(m.Pause), now)
		// Announced once the bucket was reset: any slot booked before now
		// may be from before the reset, so it is void.
		v.hold.At = now
	case notice.Rate:
		v.rate.read = time.Time{} // read the climb with the next take
	}
}
