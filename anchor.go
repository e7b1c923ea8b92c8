package fleetrate

import (
	"sync"
	"time"
)

// anchorAge bounds how long a clock anchor is trusted. Within it, the
// store's clock and this process's monotonic clock may drift apart by the
// clocks' rate difference (at most about half a millisecond a second under
// NTP slewing, typically a few microseconds), which is all an anchor can
// get wrong.
const anchorAge = time.Second

// anchor maps the store's clock (Result.At) onto this process's monotonic
// clock, so that a booked slot is timed from the store's decision rather
// than from when its reply was read: a reply delayed by a busy scheduler
// or a burst of replies then costs the waiter nothing.
//
// The mapping comes from the fastest round trip of the last anchorAge:
// that decision happened at most rtt/2 after the round trip's local
// midpoint, so any later decision at store time At happened, locally, at
// most mid + rtt/2 + (At - anchor's At). A slot computed that way is never
// early (up to the clocks' drift within anchorAge). A slot that falls
// outside [start + wait, answered + wait], where the decision must lie,
// shows that the mapping does not hold (the store's clock jumped, as in a
// failover to another host), and the slot then counts from the answer;
// within that window, a jump can make a wake-up early by no more than the
// request's own round trip. Stores with several clocks (MultiClock) are
// never anchored, nor are degraded results.
type anchor struct {
	off   bool // the store has several clocks: count from the answer
	mu    sync.Mutex
	local time.Time     // local midpoint of the anchoring round trip (monotonic)
	store time.Time     // the store's clock at that decision
	rtt   time.Duration // that round trip
	ok    bool
}

// due returns the local time at which the slot of res, requested at start
// and answered at answered (both read from time.Now), begins, and takes
// the round trip as a sample for later calls.
func (a *anchor) due(start, answered time.Time, res Result) time.Time {
	latest := answered.Add(res.Wait)
	if a.off || res.At.IsZero() || res.Degraded {
		// No single store clock to anchor to (a degraded result is timed
		// by a local fallback's clock, not the store's).
		return latest
	}
	rtt := answered.Sub(start)
	a.mu.Lock()
	if !a.ok || rtt <= a.rtt || answered.Sub(a.local) > anchorAge {
		a.local, a.store, a.rtt, a.ok = start.Add(rtt/2), res.At, rtt, true
	}
	local, store, arr := a.local, a.store, a.rtt
	a.mu.Unlock()
	// Result.At has microsecond resolution: allow one for each reading.
	d := local.Add(arr/2 + res.At.Sub(store) + 2*time.Microsecond + res.Wait)
	if d.Before(start.Add(res.Wait)) || d.After(latest) {
		// Placed before the request or after the answer: the mapping does
		// not hold for this result (its clock jumped, or it is another
		// clock), so count from the answer.
		return latest
	}
	return d
}
