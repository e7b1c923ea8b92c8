package transport

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/pacer"
)

// An Attempt is one send of a request that something other than the
// Transport sends: Book waits for the request's turn exactly as RoundTrip
// does (pacing, pauses, the spacing gate, an in-flight permit), the caller
// sends it, and Report tells the transport what the upstream answered, so
// that a 429 pauses the fleet, the rate adapts and rate-limit fields
// steer it as for a request RoundTrip sent; Report then says whether and
// when to send the request again. RoundTrip itself is Book, a send and
// Report in a loop.
//
// It is how `fleetrate serve` gives workers in other languages the whole
// outbound protocol, and it serves a Go caller whose HTTP client cannot
// take a RoundTripper. Every Attempt must be reported or abandoned: until
// then it holds its in-flight permit and renews its lease.
type Attempt struct {
	t       *Transport
	ctx     context.Context
	tg      Target
	pt      pacer.Target
	attrs   []slog.Attr
	r       *fleetrate.Reservation
	h       *held
	gate    pacer.GatePass
	n       int
	waited  time.Duration
	sent    time.Time
	late    time.Duration // the caller's Answer.SentAfter
	rtt     time.Duration // the caller's Answer.RTT
	bypass  bool
	settled bool // the answer's costs were settled by Report
}

// Answer is what the upstream answered an Attempt.
type Answer struct {
	// Response is the upstream's answer: its status and header are read,
	// its body is not (nil for a round trip that failed).
	Response *http.Response
	// Err is why the round trip failed, when it did.
	Err error
	// Sent says, with Err, whether the upstream may have received the
	// request (its headers were written): an in-flight permit then stays
	// taken until its lease ends, since the upstream may still be running
	// the request; otherwise it is given back at once.
	Sent bool
	// Costs are what the request really cost the upstream's meters, by
	// meter name: the booking is settled to them (see Settle). A meter
	// not named keeps its booked cost.
	Costs map[string]int64
	// SentAfter is how long after Book returned the request went out, as
	// the caller measured it, with the time the booking took to reach it
	// when it came over a network (a worker of the service's outbound
	// protocol): 0 means at once. RTT is how long the upstream took to
	// answer from the send; 0 means unknown, taken as the time from the
	// send to Report. An endpoint's spacing gate reads them to judge how
	// late the request may have reached the upstream, and how soon after
	// its arrival the next may go (see Endpoint.Spacing): without them a
	// remote worker's own delays count as the upstream's.
	SentAfter, RTT time.Duration
}

// Next says what follows an Attempt's answer.
type Next struct {
	// Retry says to send the request again, booking attempt Attempt after
	// sleeping After (a rate limit: the fleet is paused already).
	Retry   bool
	After   time.Duration
	Attempt int
}

// WithCosts returns a context whose requests cost the upstream's meters
// costs, by meter name, in place of their endpoint's Costs and CostFunc:
// an estimate a caller knows better than the endpoint's.
func WithCosts(ctx context.Context, costs map[string]int64) context.Context {
	return context.WithValue(ctx, costsKey{}, maps.Clone(costs))
}

type costsKey struct{}

// WithMaxWait returns a context whose requests wait at most d for their
// turn, below the transport's MaxWait: 0 sends a request only if its turn
// is now, and fails it at once with backpressure otherwise.
func WithMaxWait(ctx context.Context, d time.Duration) context.Context {
	return pacer.WithMaxWait(ctx, d)
}

// Book waits for req's turn to be sent for the attempt-th time (1 for the
// first) and returns the booked Attempt, or an error as RoundTrip returns
// one before it sends: a classification error, a *fleetrate.BackpressureError
// when the wait would exceed the max wait, a store failure, or the
// context's error. req's context bounds the wait and is the Attempt's; its
// body is not read; once Book returns, the context's cancel and deadline
// no longer apply to the Attempt, its values do. A request the classifier bypasses is booked at once
// and Report only says not to retry it.
func (t *Transport) Book(req *http.Request, attempt int) (*Attempt, error) {
	if attempt < 1 {
		return nil, fmt.Errorf("%w: transport: attempt must be >= 1, got %d", fleetrate.ErrInvalid, attempt)
	}
	tg, err := t.target(req)
	if err != nil {
		return nil, err
	}
	if tg.Bypass {
		return &Attempt{t: t, ctx: req.Context(), tg: tg, n: attempt, bypass: true}, nil
	}
	attrs := tg.attrs()
	a, err := t.book(req.Context(), tg, tg.pace(attrs), attrs, attempt)
	if err != nil {
		a.dropHold()
		return nil, err
	}
	// The answer comes after the call that booked may have ended: its
	// context's values stay, its cancel and deadline do not.
	a.ctx = context.WithoutCancel(a.ctx)
	a.sent = t.now()
	return a, nil
}

// book waits for the attempt-th send of a request of tg: its booking,
// what it holds while its answer is out, and its pass through the spacing
// gate. On an error the Attempt is still returned, for its hold to drop.
func (t *Transport) book(ctx context.Context, tg Target, pt pacer.Target, attrs []slog.Attr, attempt int) (*Attempt, error) {
	a := &Attempt{t: t, ctx: ctx, tg: tg, pt: pt, attrs: attrs, n: attempt}
	began := t.now()
	r, paced, err := t.wait(ctx, tg, pt)
	a.r, a.h = r, t.hold(ctx, tg, attrs, r)
	if err != nil {
		return a, err
	}
	if attempt > 1 {
		t.m.retried(tg)
	}
	if tg.Spacing > 0 && paced {
		if a.gate, err = t.pacer.PassGate(ctx, pt, t.pacer.Budget(ctx)-t.now().Sub(began)); err != nil {
			if err = t.pacer.WaitFailed(ctx, pt, err); err != nil {
				return a, err
			}
		}
	}
	a.waited = t.now().Sub(began)
	return a, nil
}

// Endpoint returns the name of the endpoint the Attempt's request counts
// against.
func (a *Attempt) Endpoint() string { return a.tg.Endpoint }

// Waited returns how long Book waited for the Attempt's turn.
func (a *Attempt) Waited() time.Duration { return a.waited }

// Report takes the upstream's answer to the Attempt and returns what
// follows: nothing more (Next.Retry false), or another attempt after a
// sleep. An error is the request's end as RoundTrip would return it: a
// *GaveUpError when the request is still rate limited after the last
// attempt (or its context's deadline leaves no time for another), or the
// error of the transport's CheckRetry. An Attempt is reported once; a
// second Report is an error wrapping fleetrate.ErrInvalid.
func (a *Attempt) Report(ans Answer) (Next, error) {
	if a.bypass {
		return Next{}, nil
	}
	if a.r == nil && a.h == nil && a.sent.IsZero() {
		return Next{}, fmt.Errorf("%w: transport: attempt reported twice", fleetrate.ErrInvalid)
	}
	resp := ans.Response
	if ans.Err != nil {
		resp = nil
	}
	if resp != nil && len(ans.Costs) > 0 && a.r != nil && !IsRateLimited(resp) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(a.ctx), storeTimeout)
		a.t.settle(ctx, a.tg, a.attrs, a.r, ans.Costs)
		cancel()
		a.settled = true
	}
	if a.h != nil {
		a.h.handed = true
		a.h.asked.Store(true)
		a.h.wrote.Store(ans.Sent)
		if ans.Err != nil && a.h.permit && ans.Sent {
			a.h.abandon("failed_after_send", "rate_permit_abandoned")
		} else if a.settled {
			a.h.end(nil, nil) // settled above: release only
		} else {
			a.h.end(resp, nil)
		}
	}
	a.late, a.rtt = max(ans.SentAfter, 0), max(ans.RTT, 0)
	li, err := a.observe(resp, ans.Err)
	if err != nil {
		a.forget()
		return Next{}, err
	}
	nx, err := a.t.next(a.ctx, a, resp, ans.Err, li, true)
	a.forget()
	return nx, err
}

// Abandon ends an Attempt that will not be reported: its in-flight permit
// lapses at the end of its lease, since the upstream may be running the
// request, and is counted and logged with cause "unreported".
func (a *Attempt) Abandon() {
	if a.h != nil {
		a.h.abandon("unreported", "rate_permit_abandoned")
	} else if a.r != nil {
		a.r.Abandon()
	}
	a.forget()
}

// dropHold ends the hold of an attempt whose answer's body never reached
// the caller (see held.drop).
func (a *Attempt) dropHold() {
	if a != nil {
		a.h.drop()
	}
}

// forget marks the Attempt as reported.
func (a *Attempt) forget() { a.r, a.h, a.sent, a.late, a.rtt = nil, nil, time.Time{}, 0, 0 }

// observe hands the answer to a request sent at a.sent to the pacer: a
// rate limit pauses the fleet and lowers the rate, any answer's rate-limit
// fields steer it, an admitted one lets the rate climb and passes the
// spacing gate's answer time. An error is the pause's failure.
func (a *Attempt) observe(resp *http.Response, err error) (limitInfo, error) {
	t := a.t
	sent, rtt := a.timing(t.now())
	var li limitInfo
	switch {
	case err == nil && IsRateLimited(resp):
		if li, err = t.onLimited(a.ctx, a.tg, a.pt, resp, sent, a.n); err != nil {
			return li, err
		}
		// After the pause is set: its fields may state the limit, or a
		// reset beyond the Retry-After.
		t.readHeaders(a.ctx, a.tg, a.pt, resp)
	case err == nil && resp != nil:
		t.pacer.Admitted(a.pt)
		t.readHeaders(a.ctx, a.tg, a.pt, resp)
		if a.gate.Passed {
			// A 429 may come back sooner than an answer, and its pause
			// holds the fleet anyway: only answers count.
			t.pacer.Answered(a.ctx, a.pt, a.gate, sent, rtt)
		}
	}
	return li, nil
}

// timing returns when the request of a went out and how long its answer
// took, at now: from Book's return, unless the caller said better
// (Answer.SentAfter and RTT), within the time since Book returned.
func (a *Attempt) timing(now time.Time) (sent time.Time, rtt time.Duration) {
	since := max(now.Sub(a.sent), 0)
	sent = a.sent.Add(min(a.late, since))
	rtt = now.Sub(sent)
	if a.rtt > 0 {
		rtt = min(a.rtt, rtt)
	}
	return sent, rtt
}

// next decides what follows the answer to attempt a: a retry after a
// sleep, nothing (Next.Retry false: the answer is the caller's), or an
// error ending the request (CheckRetry's, or a *GaveUpError). replayable
// says whether the request's body can be sent again.
func (t *Transport) next(ctx context.Context, a *Attempt, resp *http.Response, err error, li limitInfo, replayable bool) (Next, error) {
	retry, cerr := t.checkRetry(ctx, resp, err)
	switch {
	case cerr != nil:
		return Next{}, cerr
	case !retry || !replayable:
		// Without a replayable body the caller gets the upstream's
		// answer unchanged: no retry can be sent.
		return Next{}, nil
	case a.n >= t.maxAttempts:
		if li.limited {
			return Next{}, t.gaveUp(ctx, a.tg, a.attrs, a.n, resp, li)
		}
		return Next{}, nil
	}
	delay := max(t.backoff(a.n, t.backoffMin, t.backoffMax), li.pause)
	if dl, ok := ctx.Deadline(); ok && li.limited && dl.Sub(t.now()) < delay {
		li.cause = context.DeadlineExceeded
		return Next{}, t.gaveUp(ctx, a.tg, a.attrs, a.n, resp, li)
	}
	return Next{Retry: true, After: delay, Attempt: a.n + 1}, nil
}
