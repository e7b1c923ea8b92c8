package gcra

import (
	"time"

	"github.com/fleetrate/fleetrate"
)

// Refund gives back, at now (µs), n tokens of a grant made at at (µs) that
// was never used (an Allow whose work was not done), as far as giving them
// back cannot grant anything the grant's absence would not have:
//
//   - only what time has not refilled since the grant: a bucket that the
//     grant emptied refills from at, and refill beyond the burst is lost,
//     so n tokens given back after the bucket would have been full again
//     would be granted twice. Each limit gets back n × interval less the
//     time since at (never below zero), at most its debt: exact when the
//     bucket was otherwise idle, less when others took from it meanwhile;
//   - nothing while a slot is booked ahead on the limit, or it is drained:
//     a later take would then be granted a slot before one booked already,
//     closer to it than the limit allows. That is when the debt is above
//     the fill time less reserve tokens (reserve: the largest
//     Bucket.Reserve a take from the bucket uses, whose slots are booked
//     ahead while the debt is below the fill time).
//
// It reports whether any limit changed. A booking made ahead (Reserve,
// Wait) is given back with Cancel.
func Refund(now int64, limits []fleetrate.Limit, s *State, n, at, reserve int64) bool {
	s.Elapse(now, limits)
	el := refundElapsed(now, at)
	changed := false
	for i := range limits {
		if back := refundBack(&limits[i], s.Debts[i], n, el, reserve); back > 0 {
			s.Debts[i] -= back
			s.spend(i, -1, back)
			changed = true
		}
	}
	s.dropFullLeads()
	return changed
}

// refundElapsed is the time (ns) since a grant made at at (µs) that Refund
// counts. A grant older than the longest fill time has been refilled in
// full by every limit: clamping there keeps it below 2^53, as the Lua
// mirror needs, and changes no answer.
func refundElapsed(now, at int64) int64 {
	return min(max(now-at, 0), refundHorizonUS) * 1000
}

// refundBack is what Refund gives back to limit l at debt d (ns) of n
// tokens granted el ns ago: n intervals less el, at most d, and nothing
// while a slot is booked ahead (d above the fill time less the reserve).
func refundBack(l *fleetrate.Limit, d, n, el, reserve int64) int64 {
	iv := l.Interval()
	if d <= 0 || d > (l.Burst-min(max(reserve, 0), l.Burst))*iv {
		return 0
	}
	// No grant took more than a burst: n × iv is then at most the fill
	// time, below el's clamp.
	return max(min(min(n, l.Burst)*iv-el, d), 0)
}

// spend lowers the leads of limit i after a give-back of back ns for a
// grant of key at (-1: unknown), when s keeps them (see Lead.spend).
func (s *State) spend(i int, at, back int64) {
	if s.hasLeads() {
		s.Leads[i].spend(at, back)
	}
}

// refundHorizonUS is how far back (µs) Refund counts the time since a
// grant: one µs beyond MaxFillTime.
const refundHorizonUS = int64(fleetrate.MaxFillTime/time.Microsecond) + 1

// giveBack returns debt less n tokens of interval iv, at least 0. It
// compares before multiplying: n × iv can overflow for a huge n.
func giveBack(debt, n, iv int64) int64 {
	if n > debt/iv {
		return 0
	}
	return debt - n*iv
}

// Cancel gives back, at now (µs), a booking of n tokens that a take made
// at stamp and that left the limits of this bucket at debts booked (the
// bucket's part of a fleetrate.Booking), whose slot began wait ns after
// stamp (see BookedWait). Once the slot has begun nothing goes back, as
// x/time/rate's Cancel restores nothing after its time to act: a caller
// may have acted on it. Before that, each limit is handled on its own: a
// limit whose debt is still the one the booking left had nothing booked
// after it, and gets the n tokens back; a limit that another take has
// booked since (or that was drained, refunded or converted to other
// limits) keeps them, because the later booking's slot was computed from
// them and giving them back would grant that slot twice. This is
// x/time/rate's Reservation.Cancel for a token bucket shared by a fleet:
// what no later booking relies on goes back, nothing else.
//
// It reports whether any limit changed.
func Cancel(now int64, limits []fleetrate.Limit, s *State, n, stamp int64, booked []int64, wait int64) bool {
	s.Elapse(now, limits)
	if len(booked) != len(limits) || n == 0 {
		return false
	}
	// Both sides below 2^53: the difference of two stamps of one clock
	// within the life of a booking, and debts.
	el := (now - stamp) * 1000
	if el > wait {
		return false
	}
	changed := false
	for i := range limits {
		if d := s.Debts[i]; d > 0 && d+el == booked[i] {
			s.Debts[i] = giveBack(d, n, limits[i].Interval())
			s.spend(i, -1, d-s.Debts[i])
			changed = true
		}
	}
	s.dropFullLeads()
	return changed
}

// Settle adjusts, at now (µs), a grant that took cost tokens from this
// bucket and whose work really cost actual, its slot having begun at at
// (µs, its key: fleetrate.Settlement.At): when actual is less, each limit
// gets back the difference as far as no later take relies on it (see
// settleBack); when more, every limit owes the difference at once (its
// debt grows by it, at most to MaxDebt of its fill time), which pushes
// later slots back and is never refused. It reports whether any limit
// changed.
//
// The bound it keeps (FuzzSettleBound): for grants in the order of their
// slots, in every window from one grant's slot to a later one's, the real
// costs of its grants are at most burst + rate × window plus the
// under-estimates (actual − cost, when positive) of those of its grants
// not yet settled when the last of them was decided. Giving back the
// whole difference whenever the bucket has not been full since at would
// break it: a later grant that found the bucket nearly full relied on the
// refill the lower cost would have lost (see
// TestSettleGivesBackOnlyTheSlackOfLaterGrants and docs/ARCHITECTURE.md,
// "Settling").
func Settle(now int64, limits []fleetrate.Limit, s *State, cost, actual, at, reserve int64) bool {
	s.Elapse(now, limits)
	if actual < cost {
		return settleBack(now, limits, s, cost-actual, at, reserve)
	}
	if actual == cost {
		return false
	}
	// actual <= burst is validated, so (actual-cost) × iv is at most a
	// fill time f, and the sum at most 2f + MaxWaitCap before it is
	// capped at MaxDebt: below 2^53 for a limit of fill time up to
	// CoarseFillTime, and in whole µs (exact in the Lua mirror's doubles
	// below 2^56) for a coarser one, whose interval is whole µs.
	for i := range limits {
		f := fill(&limits[i])
		d := s.Debts[i] + (actual-cost)*limits[i].Interval()
		if s.hasLeads() {
			// The debt was clamped at 0 (a full bucket) and the charge
			// at MaxDebt: an earlier grant's lower cost would lower the
			// result by no more than the debt before, nor beyond the cap.
			lead := s.Debts[i]
			if d > MaxDebt(f) {
				lead = 0
			}
			s.Leads[i].note(lead)
		}
		s.Debts[i] = min(d, MaxDebt(f))
	}
	return true
}

// settleBack gives back, on each limit of s (elapsed to now), n tokens of
// a grant of key at (µs) that cost that much less than it took: the more
// of what Refund gives back (see refundBack) and of n intervals at most
// the least lead of what was decided after the grant (Lead.least), at
// most the debt. With no take after it, that is the whole difference; a
// later take that found the bucket nearly full caps it at the refill it
// relied on. Each give-back lowers the leads of what came after the
// grant, since they are lower in the chain where it cost less.
func settleBack(now int64, limits []fleetrate.Limit, s *State, n, at, reserve int64) bool {
	el := refundElapsed(now, at)
	changed := false
	for i := range limits {
		l := &limits[i]
		d := s.Debts[i]
		back := refundBack(l, d, n, el, reserve)
		if s.hasLeads() {
			back = max(back, min(min(n, l.Burst)*l.Interval(), s.Leads[i].least(at), d))
		}
		if back > 0 {
			s.Debts[i] = d - back
			s.spend(i, at, back)
			changed = true
		}
	}
	s.dropFullLeads()
	return changed
}

// MaxDebt is the most a limit of fill time f (ns) may owe, in ns: its fill
// time plus the longest wait, what a take and a drain can leave at most,
// so that one refill of MaxElapse pays it (see Settle).
func MaxDebt(f int64) int64 { return f + int64(fleetrate.MaxWaitCap) }

// BookedWait returns how long (ns) after its stamp the slot of a booking
// begins, from the debts it left (booked, bucket by bucket in the order of
// buckets, limit by limit): a take books every limit at its slot, so each
// limit's debt less its fill time is at most the wait, and the limit that
// decided it has exactly that. A bucket's reserve, which the take counted
// as tokens needed, is not counted here: a reserve makes the wait longer
// than this, never shorter, so a cancel may find the slot begun up to the
// reserve's intervals early, and give back nothing, but never late. It is
// 0 when booked does not match the buckets' limits.
func BookedWait(buckets []fleetrate.Bucket, booked []int64) int64 {
	var wait int64
	pos := 0
	for b := range buckets {
		for i := range buckets[b].Limits {
			if pos == len(booked) {
				return 0
			}
			wait = max(wait, booked[pos]-fill(&buckets[b].Limits[i]))
			pos++
		}
	}
	return wait
}

// Drain empties every limit of the state until d from now (µs): the bucket
// admits nothing before now+d and then refills from empty, as if every
// token had been taken at now+d. A drain never shortens an existing debt,
// unless void is set: then the bookings beyond now+d are void, and the
// bucket is empty until now+d and no longer.
func Drain(now int64, limits []fleetrate.Limit, s *State, d time.Duration, void bool) {
	s.Elapse(now, limits)
	for i := range limits {
		f := fill(&limits[i])
		empty := grain(int64(d), f) + f
		if s.hasLeads() {
			s.Leads[i].note(0)
		}
		if void {
			s.Debts[i] = empty
			continue
		}
		s.Debts[i] = max(s.Debts[i], empty)
	}
}
