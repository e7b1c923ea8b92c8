package pacer

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/notice"
	"github.com/fleetrate/fleetrate/transport/internal/ratecontrol"
	"github.com/fleetrate/fleetrate/transport/internal/ratelimitheader"
)

// MinHeaderHold is the pause a stated limit that lowers the rate holds
// the fleet for when what remains needs none: long enough to be a pause
// (every process's slots booked before it, at the old rate, are void and
// booked again at the new one), short enough to cost nothing.
const MinHeaderHold = time.Millisecond

// Stated applies what an answer's rate-limit fields said of the requests
// to tg's endpoint (q, read by package ratelimitheader) before any 429:
//
//   - a limit per window below the documented rate becomes the rate
//     controller's ceiling (ratecontrol.Settings.Stated), for an adaptive
//     target;
//   - remaining requests until a reset fewer than the buckets would grant
//     before it, at their effective rate, hold the buckets fleet-wide: for
//     d = reset − remaining / rate, after which, refilling from empty at
//     the rate, they grant no more than remaining before the reset
//     (capped at maxHold; none when d is within one interval at the
//     rate); and a ceiling that lowered the rate holds them
//     for at least MinHeaderHold, so that the slots booked at the old rate
//     are void.
//
// The hold is the pause of a 429 (hold.Hold, announced), so every process
// honours it at once, and it never shortens a pause: a hold this process
// knows of that lasts as long already does. Nothing is ever raised: the
// ceiling only caps, and a hold only drains. It reports the hold taken (0
// for none) and the ceiling now in force (0 for none).
func (p *Pacer) Stated(ctx context.Context, tg Target, q ratelimitheader.Quota, maxHold time.Duration) (held time.Duration, ceiling float64, err error) {
	b, err := p.cfg.Limiter.Bucket(tg.EndpointKey)
	if err != nil {
		return 0, 0, err
	}
	// The fields count requests; the bucket counts tokens, N a request.
	documented := paceRate(b) / float64(max(tg.N, 1))
	now := p.cfg.Now()
	p.known.mu.Lock()
	v := p.known.get(tg.EndpointKey)
	lowered := false
	if p.adapts(tg) && q.Limit > 0 && q.Window > 0 {
		st, low := p.cfg.Rates.Stated(v.rate.st, p.cfg.Rates.Ceiling(float64(q.Limit)/q.Window.Seconds(), documented), now, ratecontrol.CeilingKeep(q.Window))
		p.known.setRate(v, st)
		lowered = low
	}
	if now.Before(v.rate.st.CeilingUntil) {
		ceiling = v.rate.st.Ceiling
	}
	rate := documented
	if p.adapts(tg) {
		rate *= p.cfg.Rates.Effective(v.rate.st, now)
	}
	d := HoldDown(q, rate)
	if d <= time.Duration(float64(time.Second)/rate) {
		// Within one interval: the requests in flight when the answer
		// left would otherwise draw a hold at nearly every answer near the
		// end of a window, each voiding every process's slots.
		d = 0
	}
	if lowered {
		d = max(d, MinHeaderHold)
	}
	d = min(d, maxHold)
	if d <= 0 || !now.Add(d).After(v.hold.Until) {
		p.known.mu.Unlock()
		return 0, ceiling, nil
	}
	p.known.mu.Unlock()
	return d, ceiling, p.holdStated(ctx, tg, d)
}

// HoldDown returns how long buckets pacing at rate (per second) hold so
// that, refilling from empty afterwards, they grant no more than q's
// remaining before its reset: 0 when they would not grant more anyway, or
// q states no remaining.
func HoldDown(q ratelimitheader.Quota, rate float64) time.Duration {
	if q.Reset <= 0 || !(rate > 0) {
		return 0
	}
	spend := float64(q.Remaining) / rate * float64(time.Second)
	if spend >= float64(q.Reset) || math.IsInf(spend, 0) {
		return 0
	}
	return q.Reset - time.Duration(spend)
}

// holdStated holds tg's drained buckets for d, as a 429 does (this process
// first, then the store, then the announcement), without lowering the
// rate: the upstream said where it stands, it did not refuse.
func (p *Pacer) holdStated(ctx context.Context, tg Target, d time.Duration) error {
	paced := make([]fleetrate.Bucket, len(tg.Drained))
	keys := make([]string, len(tg.Drained))
	for i, name := range tg.Drained {
		b, err := p.cfg.Limiter.Bucket(name)
		if err != nil {
			return err
		}
		paced[i], keys[i] = b, b.Key
	}
	p.pauseLocally(keys, p.cfg.Now().Add(d))
	p.cfg.Events.HeaderHeld(tg.Channel, tg.Endpoint)
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StoreTimeout)
	defer cancel()
	if err := hold.Hold(dctx, p.cfg.Limiter.Store(), p.layout(ctx, tg, paced), d); err != nil {
		p.cfg.Log.LogAttrs(ctx, slog.LevelError, "rate_store_error", append(tg.Attrs,
			slog.String("error", err.Error()), slog.Bool("fail_open", p.cfg.FailOpen))...)
		return err
	}
	for _, b := range paced {
		p.ann.Announce(ctx, notice.Message{Kind: notice.Pause, Key: b.Key, Pause: d})
	}
	return nil
}
