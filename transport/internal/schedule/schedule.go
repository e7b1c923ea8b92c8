// Package schedule is how one request of the outbound transport gets its
// turn on the fleet's shared buckets: a small state machine that books a
// slot through fleetrate.Limiter.Book and sleeps until it.
//
//		outside ──► book ──► sleep ──► verify ──► send
//		   ▲          │        │         │
//		   └──────────┴────────┴─────────┘  (look again / book again)
//
//	  - outside: sit out a hold (the fleet's pause) this process knows of,
//	    waking Lead before it ends, or fail at once with backpressure when
//	    it, or the queue this process's last booking left, outlasts the
//	    budget.
//	  - book: one atomic take of the buckets at their effective rates and
//	    of their holds. A booking behind a hold this process did not know
//	    of is given back (the 429 behind it may have lowered the rate), and
//	    a multi-bucket turn beyond the look-ahead sleeps until it is near.
//	  - sleep: until the slot; a burst-1 bucket's request wakes early and
//	    spins the rest (package sendtime).
//	  - verify: read the holds once more if this process may have missed
//	    one (not listening to announcements, nor read them within the
//	    check age); book again if the request woke too late for its
//	    buckets (sendtime.Spread), or if a pause began after it booked.
//	  - send: the request may go.
//
// The Fleet interface is everything the schedule asks of the rest of the
// transport: what this process knows of the buckets' holds and next free
// tokens, and the send-time discipline.
package schedule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
	"github.com/fleetrate/fleetrate/transport/internal/sendtime"
)

// Lead is how long before a hold this process knows of ends its waiting
// requests book. The hold drained the buckets until its end, so their
// slots still begin at the end at the earliest; booked that early, the
// answers come before the slots do, and the first requests after the pause
// go out on time rather than as late answers of a fleet that woke and
// booked at once (whose first request would go out late, and the next on
// its slot: too close to it for a strict window).
const Lead = 100 * time.Millisecond

// Fleet is what a request's schedule knows of its buckets, through the
// rest of the transport.
type Fleet interface {
	// HeldUntil returns the latest hold this process knows of the
	// buckets, and whether it has read their holds since since.
	HeldUntil(paced []fleetrate.Bucket, since time.Time) (until time.Time, fresh bool)
	// HeldSince reports whether this process learned of a hold of the
	// buckets after at.
	HeldSince(paced []fleetrate.Bucket, at time.Time) bool
	// NextFree returns when the first of the buckets' next tokens is free,
	// as far as this process's last bookings tell.
	NextFree(paced []fleetrate.Bucket) time.Time
	// Layout returns the take of the buckets at their effective rates.
	Layout(ctx context.Context, paced []fleetrate.Bucket) hold.Take
	// Learn reads a booking made at at, and reports whether it was behind
	// a hold this process did not know of, which may have changed the
	// rates: then the booking is given back and made again.
	Learn(tk hold.Take, b fleetrate.Booking, at time.Time) (rebook bool)
	// LearnNext records when a bucket's next token is free, from a denial.
	LearnNext(key string, next time.Time)
	// Spread decides when a request whose slot began at due goes out, now
	// being the time it would (see sendtime.Spread): after wait, or void.
	Spread(paced []fleetrate.Bucket, due, now time.Time) (wait time.Duration, void bool)
	// Listening reports whether every announcement since at was heard.
	Listening(at time.Time) bool
	// ReadHolds reads the take's holds (one store call) and reports
	// whether one was drained since the take booked b.
	ReadHolds(ctx context.Context, tk hold.Take, b fleetrate.Booking) (drained bool, err error)
}

// Request is one request's schedule: its buckets, its budget and what its
// failures do.
type Request struct {
	// Name names the request's target in its errors ("channel/endpoint").
	Name    string
	Fleet   Fleet
	Limiter *fleetrate.Limiter
	// Paced are the request's buckets, N its cost.
	Paced []fleetrate.Bucket
	N     int64
	// MaxWait is the budget from Start.
	Start   time.Time
	MaxWait time.Duration
	// Lookahead bounds how far ahead a multi-bucket request books.
	Lookahead time.Duration
	// CheckAge bounds how old this process's knowledge of the holds may be
	// when a request that slept wakes (see transport.Options.PauseCheckAge).
	CheckAge time.Duration
	// Now is the clock.
	Now func() time.Time
	// Failed turns a store failure or backpressure into the request's
	// error, or nil when the transport fails open.
	Failed func(error) error
	// Rebooked counts a request booked again for lateness.
	Rebooked func()
	// GiveBack is how long a booking's cancel may take once the request's
	// context has ended.
	GiveBack time.Duration

	// Costs, when set, are the cost of each of Paced, in its order,
	// instead of N from each (see fleetrate.Request.Costs).
	Costs []int64
	// Granted is, once Wait returns nil, the booking the request goes out
	// on: it holds the request's in-flight permit, if a bucket bounds
	// them, and is what a settle adjusts.
	Granted *fleetrate.Reservation

	// lateAnswer is set once a booking whose slot had begun before its
	// answer came was booked again for lateness: from then on, such a
	// booking's lateness counts from its answer, so that a slow round trip
	// to an idle bucket does not book it again and again.
	lateAnswer bool
}

// ErrFailedOpen reports that the store failed and the transport fails
// open: the request goes unpaced.
var ErrFailedOpen = errors.New("transport: store unavailable, failing open")

// state is where a request is in its schedule.
type state int

const (
	outside state = iota
	book
	sleep
	verify
	send
)

// turn is what the states pass on: the booking, its take, when it was
// made, and whether the request woke early for it.
type turn struct {
	r      *fleetrate.Reservation
	tk     hold.Take
	booked time.Time
	woke   bool
}

// Wait runs the request's schedule until it may be sent. It returns
// ErrFailedOpen when the request is to go unpaced, or the request's error.
func (q *Request) Wait(ctx context.Context) error {
	st, tn := outside, turn{}
	for {
		var err error
		switch st {
		case outside:
			if err = ctx.Err(); err != nil {
				return q.wrap("waiting for the bucket", err)
			}
			st, err = q.outside(ctx)
		case book:
			st, tn, err = q.book(ctx)
		case sleep:
			st, tn, err = q.sleep(ctx, tn)
		case verify:
			st, err = q.verify(ctx, tn)
		case send:
			q.Granted = tn.r
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// outside sits out a hold this process knows of (its own 429 sets it
// before the drain returns), or fails at once when the hold, or the queue
// this process's last booking left, outlasts the budget.
func (q *Request) outside(ctx context.Context) (state, error) {
	if until, _ := q.Fleet.HeldUntil(q.Paced, time.Time{}); until.After(q.Now().Add(Lead)) {
		// Book Lead before the hold ends: the drained bucket gives the
		// first slot at its end, and its answer comes before it.
		return outside, q.sitOut(ctx, until, Lead)
	}
	if d := q.Fleet.NextFree(q.Paced).Sub(q.Now()); d > q.Remaining() {
		// This process's last booking already queued the buckets past the
		// budget: no need to ask the store to say so.
		return outside, q.backpressure(d, fleetrate.Result{})
	}
	return book, nil
}

// sitOut sleeps until lead before until, the end of a hold this process
// knows of, or fails at once with backpressure when the hold outlasts the
// budget.
func (q *Request) sitOut(ctx context.Context, until time.Time, lead time.Duration) error {
	d := until.Sub(q.Now())
	if d > q.Remaining() {
		return q.backpressure(d, fleetrate.Result{})
	}
	if err := Sleep(ctx, d-lead); err != nil {
		return q.wrap("waiting out a pause", err)
	}
	return nil
}

// book books the request's turn: on to sleep, or back outside to look
// again (a multi-bucket turn beyond the look-ahead has come nearer, or
// the booking was behind a hold this process did not know of).
func (q *Request) book(ctx context.Context) (state, turn, error) {
	tk := q.Fleet.Layout(ctx, q.Paced)
	horizon := q.Remaining()
	if len(q.Paced) > 1 {
		horizon = min(horizon, q.Lookahead)
	}
	r, err := q.take(ctx, tk, horizon)
	if err != nil {
		var bp *fleetrate.BackpressureError
		if !errors.As(err, &bp) {
			if err := q.Failed(err); err != nil {
				return book, turn{}, err
			}
			return book, turn{}, ErrFailedOpen
		}
		if len(q.Paced) == 1 && bp.Result.InFlight.Bound == 0 {
			// (A take that bounds in-flight requests may have been
			// refused for a permit, which its RetryAfter does not tell.)
			q.Fleet.LearnNext(q.Paced[0].Key, q.Now().Add(bp.RetryAfter))
		}
		if d, ok := q.permitRetry(bp, horizon); ok {
			if err := Sleep(ctx, d); err != nil {
				return book, turn{}, q.wrap("waiting for an in-flight permit", err)
			}
			return outside, turn{}, nil
		}
		if bp.RetryAfter > q.Remaining() || bp.MaxWait < horizon {
			// Beyond the budget (or the horizon of the request's priority
			// class): say so at once.
			return book, turn{}, q.backpressure(bp.RetryAfter, bp.Result)
		}
		// A multi-bucket turn beyond the look-ahead: sleep until it is
		// within it, then book.
		if err := Sleep(ctx, bp.RetryAfter-horizon); err != nil {
			return book, turn{}, q.wrap("waiting for the bucket", err)
		}
		return outside, turn{}, nil
	}
	booked := q.Now()
	if q.Fleet.Learn(tk, r.Booking(), booked) {
		// Booked behind a hold this process did not know of, at a rate
		// the 429 behind it may have lowered: give the booking back, read
		// the rate, book again.
		q.cancel(ctx, r)
		return outside, turn{}, nil
	}
	return sleep, turn{r: r, tk: tk, booked: booked}, nil
}

// sleep sleeps until the booked slot. A request of a burst-1 bucket wakes
// early (sendtime.SpinLead), reads the holds if it must before the slot,
// so that the round trip does not make it late, and spins the rest.
func (q *Request) sleep(ctx context.Context, tn turn) (state, turn, error) {
	tn.woke = q.wakeEarly(ctx, tn.r.Due(), sendtime.SpinLead(tn.tk.Paced()))
	if tn.woke {
		if void, err := q.checkHolds(ctx, tn); err != nil || void {
			return outside, tn, err
		}
		sendtime.Spin(ctx, q.Now, tn.r.Due())
	}
	if err := tn.r.Sleep(ctx); err != nil {
		// Sleep gave the booking back: only what no later booking relies
		// on returns, and nothing while a 429's drain has moved the bucket
		// on, so a cancel never shortens a pause or grants a slot twice.
		var bp *fleetrate.BackpressureError
		if errors.As(err, &bp) {
			return sleep, tn, q.backpressure(bp.RetryAfter, bp.Result)
		}
		return sleep, tn, q.wrap("waiting for the bucket", err)
	}
	return verify, tn, nil
}

// verify checks, at the slot, that the booking still holds: no hold
// missed, not woken too late for the buckets, no pause begun since it was
// booked. A void booking is given back and the request books again.
//
// A request woken well after its slot (a stalled process: CPU starvation,
// a GC pause) would go out together with the other overdue requests of
// its process, or too close to the next slot's, whichever process holds
// it: a burst the upstream sees. So would one whose booking's answer came
// back late (at a fleet's start, the first requests book at once and the
// next slots follow theirs). Booking again gives such a request a later
// slot when others were booked behind it, or the same late answer when
// none were: it is booked again once at most (see lateAnswer).
func (q *Request) verify(ctx context.Context, tn turn) (state, error) {
	if !tn.woke { // else read before the spin
		if void, err := q.checkHolds(ctx, tn); err != nil || void {
			return outside, err
		}
	}
	due := tn.r.Due()
	begunBefore := !due.After(tn.booked) // the slot had begun before the answer came
	if begunBefore && q.lateAnswer {
		due = tn.booked
	}
	d, void := q.Fleet.Spread(tn.tk.Paced(), due, q.Now())
	switch {
	case void:
		q.lateAnswer = q.lateAnswer || begunBefore
		q.Rebooked()
		q.cancel(ctx, tn.r)
		return outside, nil
	case d > 0:
		if err := Sleep(ctx, d); err != nil {
			q.cancel(ctx, tn.r)
			return verify, q.wrap("spacing a late request", err)
		}
	}
	if until, _ := q.Fleet.HeldUntil(q.Paced, time.Time{}); until.After(q.Now()) || q.Fleet.HeldSince(q.Paced, tn.booked) {
		// Paused, or a pause began after this booking: the 429 that drew
		// it voided every booking made before it, so book again behind
		// it, at the rate it may have lowered. A slot that came before the
		// end of a pause this process knows of (booked Lead ahead, on a
		// clock a little off the store's) books again once the pause is
		// over, not at once.
		q.cancel(ctx, tn.r)
		if until.After(q.Now()) {
			if err := q.sitOut(ctx, until, 0); err != nil {
				return verify, err
			}
		}
		return outside, nil
	}
	return send, nil
}

// checkHolds reads the buckets' holds once more, when the request slept
// on its booking and this process has not read them within CheckAge nor
// listens to announcements since it booked: a hold drained after the
// booking voids it (given back: the caller books again).
func (q *Request) checkHolds(ctx context.Context, tn turn) (void bool, err error) {
	slept := tn.r.Result.Wait > 0
	if _, fresh := q.Fleet.HeldUntil(q.Paced, q.Now().Add(-q.CheckAge)); !slept || fresh || q.Fleet.Listening(tn.booked) {
		return false, nil
	}
	drained, err := q.Fleet.ReadHolds(ctx, tn.tk, tn.r.Booking())
	if err != nil {
		q.cancel(ctx, tn.r)
		return false, q.Failed(err)
	}
	if drained {
		q.cancel(ctx, tn.r)
		return true, nil
	}
	return false, nil
}

// wakeEarly sleeps until lead before due, when the request's buckets
// tolerate little send jitter (lead above 0). It reports whether it woke
// so; otherwise (no lead, a slot past the context's deadline, a context
// that ended) it leaves the wait, the deadline and a cancel to
// Reservation.Sleep.
func (q *Request) wakeEarly(ctx context.Context, due time.Time, lead time.Duration) bool {
	if lead <= 0 {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && due.After(dl) {
		return false // past the deadline: Reservation.Sleep says so at once
	}
	if d := due.Sub(q.Now()) - lead; d > 0 {
		if Sleep(ctx, d) != nil {
			return false // cancelled: Reservation.Sleep gives the booking back
		}
	}
	return ctx.Err() == nil
}

// Remaining returns what is left of the budget.
func (q *Request) Remaining() time.Duration {
	return max(q.MaxWait-q.Now().Sub(q.Start), 0)
}

// backpressure fails the wait: it would last retryAfter. The error reports
// the budget that was left, not the whole max wait: that is what the wait
// exceeded.
func (q *Request) backpressure(retryAfter time.Duration, res fleetrate.Result) error {
	return q.Failed(&fleetrate.BackpressureError{RetryAfter: retryAfter, MaxWait: q.Remaining(), Result: res})
}

func (q *Request) wrap(what string, err error) error {
	return fmt.Errorf("transport: %s: %s: %w", q.Name, what, err)
}

// cancel gives a booking back, best effort, even once the request's
// context has ended.
func (q *Request) cancel(ctx context.Context, r *fleetrate.Reservation) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), q.GiveBack)
	defer cancel()
	_ = r.Cancel(rctx)
}

// Sleep waits d or until ctx ends, whichever is first.
func Sleep(ctx context.Context, d time.Duration) error {
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
