// Package gcra is the whole token-bucket algorithm of fleetrate, for store
// authors: what a store keeps for a bucket (State) and the pure functions
// that decide a take, cancel a booking, refund, drain and convert a bucket
// whose limits changed. Users of fleetrate never call it; they call
// fleetrate.Limiter, whose Store runs these functions: package memstore
// directly, package redisstore through Lua scripts that compute the same
// integers (common.lua mirrors Convert, refill, carried and the decision
// of Decide; take_one.lua unrolls decideOne for a one-limit take), though
// not line for line: they keep a bucket in encodings of their own (a packed
// one-limit value, a text form) rather than as a State. The conformance
// suite in package storetest and the replay of every decision hold them to
// the same answers.
//
// Everything here is pure: time comes in as an argument (the store's clock,
// in microseconds since the Unix epoch) and state goes out as a value.
//
// Each limit keeps one number, its debt: how far, in nanoseconds, its
// theoretical arrival time (TAT) lies ahead of the bucket's stamp. A limit
// with interval T (ns per token) and burst b has tolerance tau = b*T. At
// time now the limit holds (tau - debt)/T tokens, so debt 0 means full and
// debt tau means empty. This is GCRA, the exact token bucket: refill is
// lazy (the debt shrinks by the elapsed time) and the take is one addition.
// A whole bucket is a stamp plus one debt per limit; no floats, no drift.
// Beside the debts a state keeps, per limit, a bounded summary of the
// leads of the takes booked on it (Lead), by which Settle gives back what
// a grant cost less as far as no later take relies on it.
package gcra

import (
	"math"
	"slices"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/inflight"
)

// MaxElapse is the longest time, in µs, that one refill counts: every debt
// is at most a fill time plus the longest wait, so a longer gap refills
// nothing more. The Lua scripts hold the same constant (MAX_ELAPSE_US); a
// test keeps the two equal.
const MaxElapse = int64(fleetrate.MaxFillTime+fleetrate.MaxWaitCap) / 1000

// State is what a store keeps for one bucket.
type State struct {
	// Stamp is the store's clock, in microseconds since the Unix epoch, at
	// which Debts were computed.
	Stamp int64
	// Debts holds each limit's debt in nanoseconds, in the order of the
	// bucket's limits. Nil or a length that does not match the limits means
	// the bucket is full (absent, or its number of limits changed).
	Debts []int64
	// Fills holds, for each limit, the fill time (burst × interval, ns) of
	// the limit the debt was written for. When a limit changes (a reload, an
	// override, another process's config), Elapse converts its debt so that
	// the fraction of the bucket in use is kept. Nil (a state written before
	// fills were kept, or debts a store already converted) converts nothing.
	Fills []int64
	// Anchor is, for a state written under limits of a shorter fill time
	// than the state it replaced (a reload that shortened a limit, or two
	// configurations of one key side by side), the stamp of that state
	// (µs); 0 otherwise. A limit of a longer fill time that reads the state
	// next refills it from the anchor, not from Stamp: the shorter limit's
	// own refills since (a fraction of a bucket refills at 1/fill per ns)
	// are not the longer one's to spend (see Elapse). Kept across the
	// shorter limits' writes until Horizon, for at most MaxAnchorAge.
	Anchor int64
	// Horizon is, for an anchored state, when the state it replaced would
	// have been full again (µs): until then the state is not full, even
	// when its own debts are (a store keeps it that long), so that a
	// longer limit never reads as full a bucket that only a shorter one
	// refilled.
	Horizon int64
	// Permits are, for a bucket that bounds in-flight takes
	// (fleetrate.Bucket.InFlight), the permits held and the takes queued
	// for one. A store keeps them until the last lease ends (see TTL).
	Permits inflight.Set
	// Quotas are, for a bucket with calendar quotas (fleetrate.Quota),
	// what each used in its window, by period. A store keeps them until
	// the last window ends (see TTL).
	Quotas []QuotaUse
	// Leads holds, for each limit, the summary of the leads of the takes
	// booked on it that Settle gives back by (see Lead). Nil or a length
	// that does not match the debts knows nothing: a settle gives back
	// only what Refund gives back.
	Leads []Lead
}

// MaxAnchorAge is how long, in µs, a state keeps its Anchor: a week, far
// beyond the fill time a configuration read in turn with another has, and
// short enough that a debt and the time since the anchor stay below 2^53
// ns, exact in the Lua mirror's doubles.
const MaxAnchorAge = int64(7*24*time.Hour) / 1000

// Elapse advances s to now (µs), refilling every limit by the elapsed time,
// and carries each limit's debt over when the limits changed (see
// carried): a limit kept, even at another position, keeps its debt; a
// limit whose fill time changed keeps the fraction of the bucket it had in
// use (see Convert and refill); an added limit starts full. A clock that
// went backwards refills nothing. A state without fill times (written
// before they were kept) and with another number of debts is a full
// bucket. It sets Anchor for the state's next write (see State.Anchor).
func (s *State) Elapse(now int64, limits []fleetrate.Limit) {
	m := len(limits)
	el := int64(0)
	if now > s.Stamp {
		el = min(now-s.Stamp, MaxElapse) * 1000
	}
	read := s.Stamp
	s.Stamp = now
	if s.Anchor != 0 && (now >= s.Horizon || now-s.Anchor > MaxAnchorAge) {
		s.Anchor, s.Horizon = 0, 0
	}
	if !s.Converts(limits) {
		if len(s.Debts) != m {
			// Absent, or written before fills were kept for another
			// number of limits: a full bucket.
			buf := make([]int64, 2*m) // one allocation for debts and fills
			s.Debts, s.Fills, s.Anchor, s.Horizon, s.Leads = buf[:m:m], buf[m:], 0, 0, nil
			for i := range limits {
				s.Fills[i] = fill(&limits[i])
			}
			return
		}
		// The same limits, or debts without fills (written before fills
		// were kept, or a store's replay of debts already converted).
		full := true
		for i, d := range s.Debts {
			s.Debts[i] = max(d-el, 0)
			full = full && s.Debts[i] == 0
		}
		if len(s.Leads) != m || full {
			// A full bucket is an absent one, whose grants get nothing
			// back by leads (see dropFullLeads).
			s.Leads = nil
		}
		return
	}
	s.carry(now, read, el, limits)
}

// carry is Elapse for a state written for other limits (see Converts),
// read at read and advanced to now, el ns later (capped): it carries each
// limit's debt over (see carried), refilled and converted (see refill),
// and anchors the state where a shorter limit replaced a longer one.
func (s *State) carry(now, read, el int64, limits []fleetrate.Limit) {
	m := len(limits)
	oldDebts, oldFills, anchor := s.Debts, s.Fills, s.Anchor
	// The converted debts are another chain's: nothing booked before goes
	// back by leads (see Lead). The old debts bound the old slots.
	defer s.forget(now, slices.Max(oldDebts))
	buf := make([]int64, 2*m)
	s.Debts, s.Fills = buf[:m:m], buf[m:]
	for j := range limits {
		s.Fills[j] = fill(&limits[j])
	}
	if anchor == 0 && refilled(oldDebts, el) {
		// Full in its own terms: a store holds no such state (it expired),
		// so it converts to full whatever it was written for. (Under the
		// same limits the refill below makes it full as well.)
		return
	}
	shorter, longer := false, false
	for j, i := range carried(oldFills, s.Fills) {
		switch {
		case i < 0:
			continue
		case oldFills[i] > s.Fills[j]:
			shorter = true
		case oldFills[i] < s.Fills[j]:
			longer = true
			if anchor != 0 && anchor < read {
				// Refill from the anchor: what the shorter limits
				// refilled since is theirs, not this limit's.
				d := oldDebts[i] + (read-anchor)*1000
				s.Debts[j] = refill(d, oldFills[i], s.Fills[j], max(min(now-anchor, MaxElapse), 0)*1000)
				continue
			}
		}
		s.Debts[j] = refill(oldDebts[i], oldFills[i], s.Fills[j], el)
	}
	switch {
	case shorter && anchor == 0:
		// Anchored at the longer limits' state (not full: see above),
		// until it would have been full again.
		s.Anchor, s.Horizon = read, read+(slices.Max(oldDebts)+999)/1000
	case longer && !shorter:
		s.Anchor, s.Horizon = 0, 0 // written under the longer limits now
	}
}

// refilled reports whether debts, refilled by el ns, are all paid: the
// bucket is full.
func refilled(debts []int64, el int64) bool {
	for _, d := range debts {
		if d > el {
			return false
		}
	}
	return true
}

// carried returns, for each limit of fill time fills[j], the index of the
// limit of a state written for limits of fill times old whose debt it
// carries over, or -1 for none (it starts full): first the limit of the
// same fill time (the same limit, perhaps moved by a reordered
// configuration), then, in order, the limits left on either side (a limit
// whose value changed). A limit added beside unchanged ones so starts
// full: giving it the fraction another limit had in use would lock a key
// that had emptied a 10/s limit out of a daily limit added beside it, for
// hours. The Lua mirror matches the same way.
func carried(old, fills []int64) []int {
	idx := make([]int, len(fills))
	used := make([]bool, len(old))
	for j, f := range fills {
		idx[j] = -1
		if j < len(old) && old[j] == f && !used[j] {
			idx[j], used[j] = j, true
			continue
		}
		for i, g := range old {
			if g == f && !used[i] {
				idx[j], used[i] = i, true
				break
			}
		}
	}
	next := 0
	for j := range fills {
		if idx[j] >= 0 {
			continue
		}
		for next < len(old) && used[next] {
			next++
		}
		if next == len(old) {
			break
		}
		idx[j], used[next] = next, true
	}
	return idx
}

// refill returns the debt, under a limit of fill time to, of a bucket
// that owed debt under a limit of fill time from el ns ago: refilled by el
// in the terms of the slower of the two to refill (the longer fill time),
// and converted (see Convert). A fraction of a bucket refills at 1/fill
// per ns: refilling in the faster limit's terms would grant the slower
// one what only the faster refills. Two configurations of one key taking
// in turn so never refill it faster than either does alone (the slower
// one converts what the faster one wrote before it refills).
func refill(debt, from, to, el int64) int64 {
	if from >= to {
		return Convert(max(debt-el, 0), from, to)
	}
	return max(Convert(debt, from, to)-el, 0)
}

// Converts reports whether Elapse would carry s's debts over to other
// limits (see carried): a limit's fill time changed, or s was written for
// another number of limits. A store that decides on its stored state in
// place must decide on a copy then, so that a take that books nothing
// (a peek, a denial) leaves the state as the Lua mirror leaves it: a
// configuration that peeks a key in turn with another that takes would
// otherwise convert the bucket back and forth at every peek.
func (s *State) Converts(limits []fleetrate.Limit) bool {
	if len(s.Debts) == 0 {
		return false // full: nothing to convert
	}
	if len(s.Debts) != len(limits) {
		return len(s.Fills) == len(s.Debts)
	}
	if len(s.Fills) != len(limits) {
		return false
	}
	for i := range limits {
		if s.Fills[i] != fill(&limits[i]) {
			return true
		}
	}
	return false
}

// Clone returns a copy of s with debts and fills of its own.
func (s *State) Clone() State {
	c := State{Stamp: s.Stamp, Debts: slices.Clone(s.Debts), Fills: slices.Clone(s.Fills), Anchor: s.Anchor, Horizon: s.Horizon, Quotas: slices.Clone(s.Quotas), Leads: slices.Clone(s.Leads)}
	if !s.Permits.Empty() {
		c.Permits = s.Permits.Clone()
	}
	return c
}

// fill is a limit's fill time in ns, burst × interval (at most
// fleetrate.MaxFillTime, rounded up).
func fill(l *fleetrate.Limit) int64 { return l.Burst * l.Interval() }

// coarseNS is fleetrate.CoarseFillTime in ns: a limit of a longer fill
// time keeps its debts in whole microseconds (see grain).
const coarseNS = int64(fleetrate.CoarseFillTime)

// grain returns x (ns, not negative) as a debt of a limit of fill time f
// may hold it: x itself when f is at most coarseNS, else rounded up to a
// whole number of microseconds, so that sums of such debts, intervals
// (whole µs, see fleetrate.Limit.Interval) and elapsed times (whole µs)
// stay exact in the Lua mirror's doubles up to 2^56 (see
// fleetrate.MaxFillTime). The Lua mirror has the same function.
func grain(x, f int64) int64 {
	if f <= coarseNS {
		return x
	}
	return (x + 999) / 1000 * 1000
}

// Convert returns the debt, under a limit of fill time to, of a bucket that
// owed debt under a limit of fill time from. The part of the debt within
// the old fill time is a fraction of the bucket in use and is kept as that
// fraction, so that a key that used half of 100/day is half full under
// 10/minute, not locked out for 12 hours; the part beyond it (tokens booked
// ahead of an empty bucket, by waits and drains) is time already promised
// and is kept as it is. A bucket is so never refused longer than the new
// limit takes to refill from empty, plus what was booked ahead.
//
// The fraction is computed in float64 with the operations in the order of
// the Lua mirror, so that both give the same integer, and rounded up: a
// conversion, or a round trip between two processes configured apart,
// never makes a token.
func Convert(debt, from, to int64) int64 {
	if from <= 0 || debt <= 0 {
		return max(debt, 0)
	}
	if debt > from {
		return to + grain(debt-from, to)
	}
	return grain(min(int64(math.Ceil(float64(debt)/float64(from)*float64(to))), to), to)
}

// TTL returns how long a store must keep the state: until every limit is
// full again and the last permit's lease has ended, when the state equals
// an absent one.
func (s *State) TTL() time.Duration {
	var m int64
	for _, d := range s.Debts {
		m = max(m, d)
	}
	if last := s.Permits.Last(); last > s.Stamp {
		m = max(m, (last-s.Stamp)*1000)
	}
	for _, u := range s.Quotas {
		if u.End > s.Stamp {
			m = max(m, (u.End-s.Stamp)*1000)
		}
	}
	return time.Duration(m)
}
