package transport

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/fleetrate/fleetrate"
)

// A strict window (Endpoint.Spacing) admits one request per interval and
// no burst, so it refuses a request that reaches it a little early. A
// fleet paced at 95 % of it (52.6 ms apart for a 50 ms window) keeps 2.6
// ms between its slots, but the wire does not: a request that spends 3 ms
// more on the way than the next one reaches the upstream less than 50 ms
// before it, draws a 429 and, from most upstreams, a pause of the whole
// credential. The outbound benchmark's wire has such a tail (up to 20 ms),
// and the strict window then read 78-95 % of its rate with 0-3 429s a
// minute (docs/BENCHMARKS.md, "The strict window under a jitter tail, and
// the spacing gate").
//
// A response cannot leave the upstream before its request reached it, so
// the sender of a request whose answer came back late knows, long before
// the next slot, that the request may have reached the upstream late, and
// by at most how much. The spacing gate shares that: a bucket in the store
// beside the endpoint's, of one token per Spacing + SpacingMargin, that
// every request takes just before it goes out (waiting for it when
// needed), together with a hold marker that a late answer drains, so that
// the next request, whichever process sends it, leaves no sooner than
// Spacing after the late one may have arrived (see answered).

// SpacingMargin returns what the spacing gate adds to an endpoint's
// Spacing: a millisecond, or a twentieth of spacing when that is less. A
// request may leave this much later than the gate let it go, or come back
// this much later than the endpoint's quickest recent answer, without
// holding the gate: the gate's interval already covers it.
func SpacingMargin(spacing time.Duration) time.Duration {
	return min(time.Millisecond, spacing/20)
}

// The bounds of Endpoint.Spacing.
const (
	minSpacing = time.Millisecond
	maxSpacing = time.Minute
)

// spacingBounds checks a spacing against the bounds of Endpoint.Spacing.
func spacingBounds(d time.Duration) error {
	if d != 0 && (d < minSpacing || d > maxSpacing) {
		return fmt.Errorf("must be 0 or between %v and %v, got %v", minSpacing, maxSpacing, d)
	}
	return nil
}

// checkSpacing checks an endpoint's Spacing against its bounds and its
// limits, which must have burst 1 and pace at most as fast as the gate,
// naming field.
func checkSpacing(e Endpoint, field string) error {
	if e.Spacing == 0 {
		return nil
	}
	if err := spacingBounds(e.Spacing); err != nil {
		return fmt.Errorf("%w: %s.spacing: %w", fleetrate.ErrInvalid, field, err)
	}
	gate := gateLimit(e.Spacing)
	for j, l := range e.Limits {
		if l.Burst != 1 {
			return fmt.Errorf("%w: %s.limits[%d]: burst must be 1 with a spacing (a strict window has none), got %d", fleetrate.ErrInvalid, field, j, l.Burst)
		}
		if l.Rate > gate.Rate {
			return fmt.Errorf("%w: %s.limits[%d]: rate %v/s is faster than spacing %v lets through (at most %.4g/s: one request per spacing + %v, its margin)",
				fleetrate.ErrInvalid, field, j, l.Rate, e.Spacing, gate.Rate, SpacingMargin(e.Spacing))
		}
	}
	return nil
}

// gateLimit is the spacing gate's limit: one token per spacing +
// SpacingMargin, no burst.
func gateLimit(spacing time.Duration) fleetrate.Limit {
	return fleetrate.Every(spacing+SpacingMargin(spacing), 1).Named("gate")
}

// gateBuckets returns the spacing gate of an endpoint's bucket: the gate,
// one token per interval, and its hold, a marker (see markerLimit) that a
// late answer drains for as long as the gate must stay shut. A request
// takes from both at once.
func gateBuckets(endpoint fleetrate.Bucket, spacing time.Duration) []fleetrate.Bucket {
	return []fleetrate.Bucket{
		{Prefix: endpoint.Prefix, Key: endpoint.Key + "#gate", Limits: []fleetrate.Limit{gateLimit(spacing)}},
		{Prefix: endpoint.Prefix, Key: endpoint.Key + "#hold", Limits: []fleetrate.Limit{holdLimit}},
	}
}

var holdLimit = markerLimit.Named("hold")

// gatePass is a request's passage through its endpoint's spacing gate.
type gatePass struct {
	gate []fleetrate.Bucket // the gate and its hold (see gateBuckets)
	// key is the endpoint bucket's key, which keys this process's view.
	key string
	// passed reports that the gate let the request go.
	passed bool
	// asked is when the take that let the request go was sent to the
	// store, plus the wait it booked, on this process's clock: the
	// request is on time when it goes then and a quickest take later.
	asked time.Time
	// quickest is the quickest recent round trip of a take of the gate.
	quickest time.Duration
}

// passGate waits until tg's spacing gate lets the request go: within
// budget, or twice the gate's interval when that is more but still within
// the max wait (a request whose slot has come is not refused for the gate
// alone), and never past ctx's deadline. It books the gate's turn at most
// a quarter of an interval ahead, and when the turn is further off, sleeps
// until it is that near and asks again: a late answer holds the gate only
// for the turns taken after it, so a turn is taken as late as it can be.
// Waiters so race for a turn rather than queue for it, whatever their
// priority: a gate's turns come one per interval, each right after the
// booked slot of the request that takes it.
func (t *Transport) passGate(ctx context.Context, tg Target, budget time.Duration) (gatePass, error) {
	b, err := t.lim.Bucket(EndpointBucket(tg.Channel, tg.Endpoint))
	if err != nil {
		return gatePass{}, fmt.Errorf("spacing gate: %w", err)
	}
	p := gatePass{gate: gateBuckets(b, tg.Spacing), key: b.Key}
	iv := time.Duration(p.gate[0].Limits[0].Interval())
	budget = min(max(budget, min(2*iv, t.maxWait)), t.budget(ctx))
	ahead := iv / 4
	start := time.Now()
	for {
		asked := time.Now()
		var bk fleetrate.Booking
		r, err := t.lim.Store().Take(ctx, fleetrate.Request{Buckets: p.gate, N: 1, MaxWait: ahead, Booking: &bk})
		if err != nil {
			return p, fmt.Errorf("spacing gate: %w", err)
		}
		replied := time.Now()
		t.views.mu.Lock()
		p.quickest = t.views.get(p.key).gateRTT.add(asked, replied.Sub(asked))
		t.views.mu.Unlock()
		if r.Allowed {
			p.asked = asked.Add(r.Wait)
			if r.Wait > 0 {
				if err := sleep(ctx, r.Wait); err != nil {
					// Give the turn back, so that the next request need
					// not wait for a send that never comes.
					cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
					_ = t.lim.Store().Cancel(cctx, p.gate, 1, bk)
					cancel()
					return p, fmt.Errorf("waiting for the spacing gate: %w", err)
				}
			}
			p.passed = true
			return p, nil
		}
		if left := budget - replied.Sub(start); r.RetryAfter > left {
			return p, fmt.Errorf("spacing gate: %w", &fleetrate.BackpressureError{RetryAfter: r.RetryAfter, MaxWait: max(left, 0), Result: r})
		}
		if err := sleep(ctx, r.RetryAfter-ahead/2); err != nil {
			return p, fmt.Errorf("waiting for the spacing gate: %w", err)
		}
	}
}

// answered learns from the answer (not a rate limit) to a request that
// passed the gate p, sent at sent and answered after rtt. The request left
// the gate's decision, reached the upstream and came back in the time from
// p.asked to its answer; beyond the quickest recent take of the gate and
// the quickest recent answer of the endpoint, that time may all have been
// spent before the request reached the upstream. When it exceeds the
// gate's margin, the gate's hold is drained so that the next request goes
// no sooner than Spacing after the late one may have arrived: Spacing
// after the answer, less the endpoint's quickest answer, the time a
// request on time would have taken to come back. (The gate's margin is
// then spent: a request late by less than it is the one the margin is
// for.) The hold reaches the next request only if the answer comes back
// before that request takes its turn, which it may book up to a quarter of
// an interval ahead; an endpoint whose quickest answer takes the whole
// Spacing tells nothing in time, and its gate is never held.
func (t *Transport) answered(ctx context.Context, tg Target, attrs []slog.Attr, p gatePass, sent time.Time, rtt time.Duration) {
	t.views.mu.Lock()
	quickest := t.views.get(p.key).rtt.add(sent, rtt)
	t.views.mu.Unlock()
	// Compared with none (0) for a process's first answers, the whole
	// round trips count as late.
	late := sent.Add(rtt).Sub(p.asked) - p.quickest - quickest
	if late <= SpacingMargin(tg.Spacing) || quickest >= tg.Spacing {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	err := t.lim.Store().Drain(dctx, p.gate[1:], tg.Spacing-quickest)
	cancel()
	attrs = append(attrs, slog.Float64("late_ms", float64(late)/float64(time.Millisecond)))
	if err != nil {
		t.log.LogAttrs(ctx, slog.LevelWarn, "rate_spacing_hold", append(attrs, slog.String("error", err.Error()))...)
		return
	}
	t.m.spacingHeld(tg)
	t.log.LogAttrs(ctx, slog.LevelDebug, "rate_spacing_hold", attrs...)
}

// rttWindow is how long the quickest answer of an endpoint counts: the
// quickest is the least over the current window and the one before.
const rttWindow = 10 * time.Second

// rttSamples is how many answers the quickest is taken over before it is
// trusted: each of them is compared with none (see answered), as a
// process's first few answers may all have been slow.
const rttSamples = 16

// rttFloor is the quickest recent answer of one endpoint in this process.
type rttFloor struct {
	cur, prev time.Duration
	start     time.Time // the current window's
	n         int       // answers since the first, or since starting over
}

// add records an answer after rtt to a request sent at now, and returns
// the quickest answer of the current window and the one before, or 0 for
// the first rttSamples answers. Two whole windows without an answer (an
// idle spell of 20 s or more) start over.
func (f *rttFloor) add(now time.Time, rtt time.Duration) time.Duration {
	switch {
	case f.start.IsZero() || now.Sub(f.start) >= 2*rttWindow:
		*f = rttFloor{cur: rtt, prev: rtt, start: now}
	case now.Sub(f.start) >= rttWindow:
		f.prev, f.cur, f.start = f.cur, rtt, now
	default:
		f.cur = min(f.cur, rtt)
	}
	if f.n++; f.n <= rttSamples {
		return 0
	}
	return min(f.cur, f.prev)
}
