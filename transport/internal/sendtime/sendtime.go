// Package sendtime is the transport's send-time discipline: when a request
// whose slot has come actually goes out. A burst absorbs a late sender; a
// strict window (burst 1) does not, so for it a request wakes a little
// early and spins out the rest of its wait (SpinLead, Spin), one woken too
// late is booked again (Spread), and an endpoint with a Spacing passes a
// gate that a late answer holds (Gate, Late).
//
// Everything here is pure: times are passed in, and the per-bucket History
// and RTT values are the caller's, kept under its lock.
package sendtime

import (
	"context"
	"runtime"
	"time"

	"github.com/fleetrate/fleetrate"
)

// LateSlack is how late after its slot a request may go out as booked:
// the send jitter a limit of burst 1 is assumed to absorb. A probe of the
// workers' wake-up lateness at load 4 read 0.6 ms at p50, 1.2 ms at p90,
// 10 ms at p95 and 25 ms at p99 when this value was chosen (the "late
// requests" section of docs/BENCHMARKS.md in git history; not re-measured
// since).
// Less would serve a strict window better, but every request booked again
// loses its slot: at 2 ms the documented 20/s burst-2 upstream, whose
// burst absorbs the lateness, booked 9 of its 1,140 requests a minute
// again, at 5 ms one (the outbound benchmark's "booked again, late"
// column, which docs/BENCHMARKS.md shows at 5 ms today), while the strict window's 429s, which come from
// jitter after the check, did not fall. A process's first requests are
// the exception (see ColdSends).
const LateSlack = 5 * time.Millisecond

// ColdSends is how many of a bucket's first requests in a process go out
// as booked only within ColdSlack of their slot at burst 1, instead of
// LateSlack: a process's first requests run code for the first time and
// open the upstream's connections, and they went out 3 ms late in most of
// the outbound benchmark's strict runs, on the fleet's first slots, where
// the next slot's request then drew a 429 (and its 2 s pause) from a
// strict window. Booking them again costs a few slots once per process.
const ColdSends = 4

// ColdSlack returns how late a cold request (see ColdSends) of a burst-1
// limit l may go out as booked: half the margin a fleet paced at 95 % of a
// strict window has (an interval / 40), at least a millisecond (a timer's
// lateness) and at most LateSlack.
func ColdSlack(l fleetrate.Limit) time.Duration {
	return min(max(time.Duration(l.Interval())/40, time.Millisecond), LateSlack)
}

// History is what one process sent of one bucket: when it last let a
// request go, when it let its first go, and how many it let go.
type History struct {
	Sent, Began time.Time
	Sends       int
}

// Record records a request let go at at.
func (h *History) Record(at time.Time) {
	h.Sent = later(h.Sent, at)
	if h.Began.IsZero() {
		h.Began = at
	}
	h.Sends++
}

// Spread decides when a request of the paced buckets, whose slot began at
// due, goes out, against the requests of this process that went out
// before it (hs, one History per paced bucket). On time (within LateSlack;
// ColdSlack for a process's first requests at burst 1), at once, now. A
// request may go out late only as far as its buckets' bursts allow: with
// burst b, an interval is 1/rate and a slot (b − 1) intervals + LateSlack
// late still keeps every window of the upstream within b + rate × the
// window, whoever holds the next slots. So a late request keeps one
// interval of its buckets' fastest limits after the last one this process
// sent (so that the overdue requests of a process that stalled go out
// spaced as booked rather than together), and one later than its buckets
// tolerate is void: booked again, so that the upstream never sees two
// requests closer than the limit allows because a process woke late. It
// returns when the request goes (to Record in each History), or void.
func Spread(paced []fleetrate.Bucket, hs []History, due, now time.Time) (at time.Time, void bool) {
	cold := false
	for _, h := range hs {
		cold = cold || h.Sends < ColdSends
	}
	gap, tolerance, onTime := Spacing(paced, cold)
	at = now
	if now.Sub(due) > onTime {
		for _, h := range hs {
			at = later(at, h.Sent.Add(gap))
		}
		if at.Sub(due) > tolerance {
			return time.Time{}, true
		}
	}
	return at, false
}

// Spacing returns the interval of the buckets' fastest limits, how late
// after its slot a request of them may go out (the least, over their
// limits, of (burst − 1) intervals + LateSlack, or for a cold request and
// burst 1, ColdSlack), and how late it may go out as booked, unspaced:
// LateSlack, or a cold request's least ColdSlack.
func Spacing(paced []fleetrate.Bucket, cold bool) (gap, tolerance, onTime time.Duration) {
	tolerance, onTime = time.Duration(1<<63-1), LateSlack
	for _, b := range paced {
		d := time.Duration(1<<63 - 1)
		for _, l := range b.Limits {
			iv := time.Duration(l.Interval())
			d = min(d, iv)
			slack := LateSlack
			if cold && l.Burst == 1 {
				slack = ColdSlack(l)
			}
			tolerance = min(tolerance, time.Duration(l.Burst-1)*iv+slack)
			onTime = min(onTime, slack)
		}
		gap = max(gap, d)
	}
	return gap, tolerance, onTime
}

// MaxSpin bounds how long before its slot a request of a burst-1 bucket
// wakes to wait out the rest without a timer.
const MaxSpin = 1500 * time.Microsecond

// SpinLead returns how long before its slot a request of the paced
// buckets wakes to wait out the rest without a timer: when a limit of
// theirs has burst 1 (its slots tolerate LateSlack, no more), MaxSpin or
// an eighth of the limit's interval, whichever is less, so that a fast
// bucket spends at most an eighth of a processor on it; otherwise 0 (a
// burst absorbs a timer's lateness). Go's timers wake a sleeper up to
// about 1 ms late (the runtime's poller sleeps in whole milliseconds),
// which is a third of the margin of a fleet paced at 95 % of a strict
// burst-1 window.
func SpinLead(paced []fleetrate.Bucket) time.Duration {
	var lead time.Duration
	for _, b := range paced {
		for _, l := range b.Limits {
			if l.Burst == 1 {
				lead = max(lead, min(MaxSpin, time.Duration(l.Interval())/8))
			}
		}
	}
	return lead
}

// Spin yields the processor until due comes on the clock now, or ctx
// ends.
func Spin(ctx context.Context, now func() time.Time, due time.Time) {
	var last time.Time
	for ctx.Err() == nil {
		t := now()
		if !t.Before(due) || t.Equal(last) {
			// Due, or a clock that stood still while this goroutine ran
			// (a coarse clock source, or testing/synctest's, which moves
			// only when every goroutine blocks): the timer does the rest.
			return
		}
		last = t
		runtime.Gosched()
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
