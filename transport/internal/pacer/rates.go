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
)

// paceRate returns the rate a bucket paces requests at over a second or
// more: its slowest limit's.
func paceRate(b fleetrate.Bucket) float64 {
	r := math.Inf(1)
	for _, l := range b.Limits {
		r = min(r, l.Rate)
	}
	return r
}

// scaled returns the limits with their rates multiplied by f, or the
// limits themselves when f is 1 or a scaled limit would not be valid.
func scaled(limits []fleetrate.Limit, f float64) []fleetrate.Limit {
	if f >= 1 {
		return limits
	}
	out := make([]fleetrate.Limit, len(limits))
	for i, l := range limits {
		out[i] = fleetrate.Limit{Name: l.Name, Rate: l.Rate * f, Burst: l.Burst}
		if out[i].Validate() != nil {
			return limits
		}
	}
	return out
}

// layout returns the take of the paced buckets at their effective rates.
// When this process's copy of a bucket's climb is older than
// Adaptive.Refresh (or an announcement or an unknown pause said it
// changed), it reads the climbs first (see readClimbs).
func (p *Pacer) layout(ctx context.Context, tg Target, paced []fleetrate.Bucket) hold.Take {
	if !p.adapts(tg) {
		return hold.Layout(paced)
	}
	p.readClimbs(ctx, paced)
	now := p.cfg.Now()
	effective := make([]fleetrate.Bucket, len(paced))
	p.known.mu.Lock()
	for i, b := range paced {
		b.Limits = scaled(b.Limits, p.cfg.Rates.Effective(p.known.get(b.Key).rate.st, now))
		if len(b.Limits) > 0 {
			p.cfg.Events.EffectiveRate(tg.Channel, tg.Endpoint, b.Key, b.Limits[0].Rate)
		}
		effective[i] = b
	}
	p.known.mu.Unlock()
	return hold.Layout(effective)
}

// readClimbs reads the climbs of the paced buckets whose copy is stale, in
// two peeks for each; a failed read keeps the copies.
func (p *Pacer) readClimbs(ctx context.Context, paced []fleetrate.Bucket) {
	now := p.cfg.Now()
	var stale []fleetrate.Bucket
	p.known.mu.Lock()
	for _, b := range paced {
		if now.Sub(p.known.get(b.Key).rate.read) >= p.cfg.Refresh {
			stale = append(stale, b)
		}
	}
	p.known.mu.Unlock()
	if len(stale) == 0 {
		return
	}
	climbs := make([]ratecontrol.Climb, len(stale))
	for i, b := range stale {
		c, err := hold.ReadClimb(ctx, p.cfg.Limiter.Store(), b, p.cfg.Now)
		if err != nil {
			return
		}
		climbs[i] = c
	}
	p.known.mu.Lock()
	defer p.known.mu.Unlock()
	for i, b := range stale {
		v := p.known.get(b.Key)
		v.rate.read = now
		p.known.setRate(v, v.rate.st.Read(climbs[i], now, p.cfg.Refresh))
	}
}

// admitted records an answer to a request of tg that was not a rate
// limit: the 429s after it start a new row (see ratecontrol.MaxSoon).
func (p *Pacer) Admitted(tg Target) {
	if p.known.inRow.Load() == 0 {
		return // no row to end: the common case costs one atomic load
	}
	p.known.mu.Lock()
	defer p.known.mu.Unlock()
	for _, name := range tg.Drained {
		if v := p.known.m[name]; v != nil {
			p.known.setRate(v, v.rate.st.Admitted())
		}
	}
}

// rateChange is a decrease recorded for bucket b.
type rateChange struct {
	b  fleetrate.Bucket
	ch ratecontrol.Change
}

// decrease lowers the effective rate of the buckets the 429 lim concerns,
// fleet-wide, by recording a new climb in their markers, to begin when
// the pause ends at resume; resumed holds when each bucket's previous
// pause ended. It reports whether a bucket was already at its floor.
func (p *Pacer) decrease(ctx context.Context, tg Target, buckets []fleetrate.Bucket, lim Limit, resumed []time.Time) (atFloor bool) {
	if !p.adapts(tg) {
		return false
	}
	now := p.cfg.Now()
	var changes []rateChange
	p.known.mu.Lock()
	for i, b := range buckets {
		v := p.known.get(b.Key)
		st, ch, floor, lowered := p.cfg.Rates.Limited(v.rate.st, ratecontrol.Evidence{
			Now: now, Sent: lim.Sent, Resume: lim.Resume,
			Resumed: resumed[i], From: v.stretchFrom(resumed[i]),
			Documented: paceRate(b), Soon: lim.Soon,
		})
		p.known.setRate(v, st)
		atFloor = atFloor || floor
		if lowered {
			// This process wrote the climb: no need to read it back.
			v.rate.read = now
			changes = append(changes, rateChange{b: b, ch: ch})
		}
	}
	p.known.mu.Unlock()
	for _, c := range changes {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.StoreTimeout)
		err := hold.WriteClimb(dctx, p.cfg.Limiter.Store(), c.b, c.ch.Climb, now)
		cancel()
		p.ann.Announce(ctx, notice.Message{Kind: notice.Rate, Key: c.b.Key})
		p.cfg.Log.LogAttrs(ctx, slog.LevelWarn, "rate_adapted", append(tg.Attrs,
			slog.String("bucket", c.b.Key),
			slog.Float64("from", c.ch.From), slog.Float64("to", c.ch.To),
			slog.Float64("peak", c.ch.Climb.W),
			slog.Float64("rate", c.ch.To*c.b.Limits[0].Rate),
			slog.Any("error", err))...)
	}
	if atFloor {
		p.cfg.Events.Persistent(tg.Channel, tg.Endpoint)
		p.cfg.Log.LogAttrs(ctx, slog.LevelError, "rate_limit_persistent", append(tg.Attrs,
			slog.Float64("floor", p.cfg.Rates.Floor))...)
	}
	return atFloor
}
