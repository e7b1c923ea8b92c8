package pacer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/schedule"
	"github.com/fleetrate/fleetrate/transport/internal/sendtime"
)

// GatePass is a request's passage through its endpoint's spacing gate
// (see package sendtime).
type GatePass struct {
	gate []fleetrate.Bucket // the gate and its hold (see hold.Gate)
	// key is the endpoint bucket's key, which keys this process's
	// knowledge.
	key string
	// Passed reports that the gate let the request go.
	Passed bool
	// asked is when the take that let the request go was sent to the
	// store, plus the wait it booked, on this process's clock.
	asked time.Time
	// quickest is the quickest recent round trip of a take of the gate.
	quickest time.Duration
}

// PassGate waits until tg's spacing gate lets the request go: within
// budget, or twice the gate's interval when that is more but still within
// the max wait (a request whose slot has come is not refused for the gate
// alone), and never past ctx's deadline. It books the gate's turn through
// the Limiter at most a quarter of an interval ahead, and when the turn is
// further off, sleeps until it is that near and asks again: a late answer
// holds the gate only for the turns taken after it, so a turn is taken as
// late as it can be. Waiters so race for a turn rather than queue for it,
// whatever their priority: a gate's turns come one per interval, each
// right after the booked slot of the request that takes it.
func (p *Pacer) PassGate(ctx context.Context, tg Target, budget time.Duration) (GatePass, error) {
	b, err := p.cfg.Limiter.Bucket(tg.EndpointKey)
	if err != nil {
		return GatePass{}, fmt.Errorf("spacing gate: %w", err)
	}
	gp := GatePass{gate: hold.Gate(b, sendtime.GateLimit(tg.Spacing)), key: b.Key}
	iv := time.Duration(gp.gate[0].Limits[0].Interval())
	budget = min(max(budget, min(2*iv, p.cfg.MaxWait)), p.Budget(ctx))
	ahead := min(iv/4, p.cfg.Limiter.MaxWait())
	start := p.cfg.Now()
	for {
		asked := p.cfg.Now()
		r, err := p.cfg.Limiter.Book(ctx, fleetrate.Request{Buckets: gp.gate, N: 1, MaxWait: ahead})
		replied := p.cfg.Now()
		var bp *fleetrate.BackpressureError
		if err != nil && !errors.As(err, &bp) {
			return gp, fmt.Errorf("spacing gate: %w", err)
		}
		p.known.mu.Lock()
		gp.quickest = p.known.get(gp.key).gate.Add(asked, replied.Sub(asked))
		p.known.mu.Unlock()
		if err == nil {
			gp.asked = asked.Add(r.Result.Wait)
			if err := r.Sleep(ctx); err != nil {
				// Sleep gave the turn back, so that the next request need
				// not wait for a send that never comes.
				return gp, fmt.Errorf("waiting for the spacing gate: %w", err)
			}
			gp.Passed = true
			return gp, nil
		}
		if left := budget - replied.Sub(start); bp.RetryAfter > left {
			return gp, fmt.Errorf("spacing gate: %w", &fleetrate.BackpressureError{RetryAfter: bp.RetryAfter, MaxWait: max(left, 0), Result: bp.Result})
		}
		if err := schedule.Sleep(ctx, bp.RetryAfter-ahead/2); err != nil {
			return gp, fmt.Errorf("waiting for the spacing gate: %w", err)
		}
	}
}

// Answered learns from the answer (not a rate limit) to a request that
// passed the gate gp, sent at sent and answered after rtt, and holds the
// gate when the answer says the request may have reached the upstream
// late (see sendtime.Late). The hold reaches the next request only if the
// answer comes back before that request takes its turn, which it may book
// up to a quarter of an interval ahead.
func (p *Pacer) Answered(ctx context.Context, tg Target, gp GatePass, sent time.Time, rtt time.Duration) {
	p.known.mu.Lock()
	quickest := p.known.get(gp.key).rtt.Add(sent, rtt)
	p.known.mu.Unlock()
	// Compared with none (0) for a process's first answers, the whole
	// round trips count as late.
	late, d := sendtime.Late(tg.Spacing, gp.asked, sent, rtt, sendtime.Quickest{Take: gp.quickest, Answer: quickest})
	if d <= 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StoreTimeout)
	err := p.cfg.Limiter.Store().Drain(dctx, gp.gate[1:], d)
	cancel()
	attrs := append(tg.Attrs, slog.Float64("late_ms", float64(late)/float64(time.Millisecond)))
	if err != nil {
		p.cfg.Log.LogAttrs(ctx, slog.LevelWarn, "rate_spacing_hold", append(attrs, slog.String("error", err.Error()))...)
		return
	}
	p.cfg.Events.SpacingHeld(tg.Channel, tg.Endpoint)
	p.cfg.Log.LogAttrs(ctx, slog.LevelDebug, "rate_spacing_hold", attrs...)
}
