package pacer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/notice"
	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
)

// Limited handles a rate limit (a 429, or a 503 with Retry-After) on
// tg's request sent at sent, the upstream asking for retryAfter (0: none
// usable): it decides the pause (see pauseFor), pauses this process's
// requests at once, lowers the effective rates of the buckets for it (see
// ratecontrol), before the pause is visible to the fleet, so that a
// process that learns of the pause reads the lowered rate, then holds the
// buckets for the pause across the fleet (hold.Hold) and announces it. It
// runs even if the caller's context has ended, since the whole fleet
// needs it. It reports the limit, and whether a bucket was at its floor
// rate already. log is called with the limit before the store is told,
// so that the request's rate_limited event comes first.
func (p *Pacer) Limited(ctx context.Context, tg Target, retryAfter time.Duration, sent time.Time, log func(Limit)) (lim Limit, atFloor bool, err error) {
	lim = Limit{Sent: sent, Soon: p.limitedAtOnce(tg, sent)}
	lim.Pause = p.pauseFor(retryAfter, tg, lim)
	lim.Resume = p.cfg.Now().Add(lim.Pause)
	log(lim)
	paced := make([]fleetrate.Bucket, len(tg.Drained))
	keys := make([]string, len(tg.Drained))
	for i, name := range tg.Drained {
		b, err := p.cfg.Limiter.Bucket(name)
		if err != nil {
			return lim, false, fmt.Errorf("transport: %s/%s: %w", tg.Channel, tg.Endpoint, err)
		}
		paced[i], keys[i] = b, b.Key
	}
	resumed := p.pauseLocally(keys, lim.Resume)
	atFloor = p.decrease(ctx, tg, paced, lim, resumed)
	// The buckets at their effective limits, and their pause markers: the
	// slots booked before the 429, at the rate that drew it, are void
	// (each waiter books again behind the pause when it learns of it).
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StoreTimeout)
	defer cancel()
	err = hold.Hold(dctx, p.cfg.Limiter.Store(), p.layout(ctx, tg, paced), lim.Pause)
	switch {
	case err == nil:
		for _, b := range paced {
			p.ann.Announce(ctx, notice.Message{Kind: notice.Pause, Key: b.Key, Pause: lim.Pause})
		}
		return lim, atFloor, nil
	case errors.Is(err, fleetrate.ErrStoreUnavailable) && p.cfg.FailOpen:
		p.cfg.Log.LogAttrs(ctx, slog.LevelError, "rate_store_error", append(tg.Attrs,
			slog.String("error", err.Error()), slog.Bool("fail_open", true))...)
		return lim, atFloor, nil
	}
	return lim, atFloor, fmt.Errorf("transport: %s/%s: draining after a rate limit: %w", tg.Channel, tg.Endpoint, err)
}

// Limit is a rate limit on a request, as Pacer.Limited decided it.
type Limit struct {
	// Sent is when the request was sent, Resume when its pause ends.
	Sent, Resume time.Time
	// Pause is how long the fleet pauses (see Pacer.Limited).
	Pause time.Duration
	// Soon reports that the limit came at once after the last pause.
	Soon bool
}

// limitedAtOnce reports whether a rate limit on tg's request sent at sent
// came before the second slot after the fleet's last pause of tg's
// endpoint, at the effective rate (see ratecontrol.LimitRange): then the pause was too
// short, and the rate is not to blame.
func (p *Pacer) limitedAtOnce(tg Target, sent time.Time) bool {
	key := tg.EndpointKey
	b, err := p.cfg.Limiter.Bucket(key)
	if err != nil {
		return false
	}
	rate := paceRate(b)
	now := p.cfg.Now()
	p.known.mu.Lock()
	defer p.known.mu.Unlock()
	v := p.known.get(key)
	if p.adapts(tg) {
		rate *= p.cfg.Rates.Effective(v.rate.st, now)
	}
	_, _, soon := ratecontrol.LimitRange(1, rate, sent, v.hold.Until)
	return soon
}

// pauseFor returns how long the rate limit lim pauses the fleet: the
// Retry-After when the upstream sent a usable one. Without one, as long as
// the fleet's longest pause (at first the backoff's floor), and twice that
// (up to the backoff's ceiling) when the limit came at once after that
// pause: an upstream that limits the first request after a pause has a
// longer pause of its own.
func (p *Pacer) pauseFor(retryAfter time.Duration, tg Target, lim Limit) time.Duration {
	if retryAfter > 0 {
		return retryAfter
	}
	p.known.mu.Lock()
	defer p.known.mu.Unlock()
	v := p.known.get(tg.EndpointKey)
	d := min(max(p.cfg.BackoffMin, v.hold.Longest), p.cfg.BackoffMax)
	if lim.Soon && v.hold.Longest > 0 {
		d = min(2*v.hold.Longest, p.cfg.BackoffMax)
	}
	v.hold.Longest = d
	return d
}

// pauseLocally stops this process's requests to the buckets until until,
// at once, before the drain that tells the rest of the fleet returns. It
// returns when each bucket's previous pause ended (zero: none known).
func (p *Pacer) pauseLocally(keys []string, until time.Time) (resumed []time.Time) {
	p.known.mu.Lock()
	defer p.known.mu.Unlock()
	now := p.cfg.Now()
	resumed = make([]time.Time, len(keys))
	for i, k := range keys {
		v := p.known.get(k)
		resumed[i] = v.hold.Until
		v.hold.Until = later(v.hold.Until, until)
		v.hold.At = now
	}
	return resumed
}
