// Package gcra is the whole token-bucket algorithm of fleetrate, for store
// authors: what a store keeps for a bucket (State) and the pure functions
// that decide a take, cancel a booking, refund, drain and convert a bucket
// whose limits changed. Users of fleetrate never call it; they call
// fleetrate.Limiter, whose Store runs these functions (package memstore
// directly, package redisstore through Lua scripts that mirror this file
// line for line, held to the same answers by the conformance suite in
// package storetest and by the replay of every decision).
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
package gcra

import (
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/fleetrate/fleetrate"
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
			s.Debts, s.Fills, s.Anchor, s.Horizon = buf[:m:m], buf[m:], 0, 0
			for i := range limits {
				s.Fills[i] = fill(&limits[i])
			}
			return
		}
		// The same limits, or debts without fills (written before fills
		// were kept, or a store's replay of debts already converted).
		for i, d := range s.Debts {
			s.Debts[i] = max(d-el, 0)
		}
		return
	}
	oldDebts, oldFills, anchor := s.Debts, s.Fills, s.Anchor
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
	return State{Stamp: s.Stamp, Debts: slices.Clone(s.Debts), Fills: slices.Clone(s.Fills), Anchor: s.Anchor, Horizon: s.Horizon}
}

// fill is a limit's fill time in ns, burst × interval (below 2^53: see
// fleetrate.MaxFillTime).
func fill(l *fleetrate.Limit) int64 { return l.Burst * l.Interval() }

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
		return to + (debt - from)
	}
	return min(int64(math.Ceil(float64(debt)/float64(from)*float64(to))), to)
}

// needs returns how long from now (ns) until n tokens conform in every
// limit of this bucket, which may be negative, and the limit that needs the
// longest. A take that must leave a reserve of r tokens needs n+r: it
// conforms when the bucket holds its n tokens and the reserve.
func needs(limits []fleetrate.Limit, debts []int64, n int64) (need int64, worst int) {
	need = math.MinInt64
	for i := range limits {
		l := &limits[i]
		iv := l.Interval()
		// (Burst-n)*T first keeps every intermediate below 2^53, as the Lua
		// mirror needs; n (with the reserve) <= Burst is validated.
		if w := debts[i] - (l.Burst-n)*iv; w > need {
			need, worst = w, i
		}
	}
	return need, worst
}

// book consumes n tokens in every limit for a grant that happens wait ns
// from now. Booking every limit at the same moment keeps each limit exact
// even when another limit delays the grant.
func book(limits []fleetrate.Limit, debts []int64, n, wait int64) {
	for i := range limits {
		debts[i] = max(debts[i], wait) + n*limits[i].Interval()
	}
}

// status reports the tokens left in the tightest limit, which limit that is,
// and how long until every limit is full.
func status(limits []fleetrate.Limit, debts []int64) (remaining int64, tightest int, reset int64) {
	remaining = math.MaxInt64
	for i := range limits {
		l := &limits[i]
		iv := l.Interval()
		tokens := int64(0)
		if left := l.Burst*iv - debts[i]; left > 0 {
			tokens = left / iv
		}
		if tokens < remaining {
			remaining, tightest = tokens, i
		}
		reset = max(reset, debts[i])
	}
	return remaining, tightest, reset
}

// plain returns l as callers see it, without a Limiter's cached fields.
func plain(l *fleetrate.Limit) fleetrate.Limit {
	return fleetrate.Limit{Name: l.Name, Rate: l.Rate, Burst: l.Burst}
}

// Decide applies one take of req.N tokens, all or nothing, across every
// bucket in req at time now (the store's clock, µs since the epoch). The
// states must be in the order of req.Buckets and are updated in place; the
// second result reports whether they changed and must be written back.
//
// The take conforms when the wait until n tokens are available in every
// limit, beyond the reserve its bucket keeps for higher priorities
// (Bucket.Reserve), is at most req.MaxWait. Then all limits are booked at that moment
// and the result is allowed with Wait set; otherwise nothing changes and
// RetryAfter says how long until the take would conform. N = 0 peeks. When
// req.Booking is set, a granted take of N > 0 records in it where it left
// every limit, for a later Cancel.
//
// Priorities. A bucket's Reserve R makes the take one of a lower class:
// it conforms only when, at its grant, every limit still holds R tokens
// beyond its n, and its MaxWait is its class's horizon D. It books as any
// take does, so every booking is an ordinary GCRA booking and the bound
// of each limit (Burst tokens plus the rate over any window) holds over
// all classes together. After a take of the lower class a limit's debt
// is at most (Burst-R)*T + D, so a take of a higher class (reserve r, n
// <= R-r tokens) that finds only lower-class bookings waits at most
// D - (R-r-n)*T, and not at all when D <= (R-r-n)*T.
//
// Decide assumes a validated request.
func Decide(now int64, req fleetrate.Request, states []State) (fleetrate.Result, bool) {
	if len(req.Buckets) == 1 && len(req.Buckets[0].Limits) == 1 && req.Booking == nil {
		var res fleetrate.Result
		b := &req.Buckets[0]
		changed := decideOne(now, &b.Limits[0], req.N, b.Reserve, req.MaxWait, &states[0], &res)
		return res, changed
	}
	return decide(now, req, states)
}

// DecideOne is Decide for a take from a single bucket, for a store's hot
// path: limits are the bucket's, s its state, and the result is written
// into *res rather than returned. It reports whether s changed. It is the
// same as Decide(now, Request{Buckets: []Bucket{{Limits: limits}}, N: n,
// MaxWait: maxWait}, []State{*s}) without the slices and the copies of the
// Result. It assumes a validated request and keeps no pointer.
func DecideOne(now int64, limits []fleetrate.Limit, n int64, maxWait time.Duration, s *State, res *fleetrate.Result) bool {
	if len(limits) == 1 {
		return decideOne(now, &limits[0], n, 0, maxWait, s, res)
	}
	bs, states := [1]fleetrate.Bucket{{Limits: limits}}, [1]State{*s}
	r, changed := decide(now, fleetrate.Request{Buckets: bs[:], N: n, MaxWait: maxWait}, states[:])
	*s, *res = states[0], r
	return changed
}

// decideOne is Decide for one bucket with one limit, the common case: the
// same steps as decide, with the loops over buckets and limits unrolled.
// reserve is the bucket's Reserve.
func decideOne(now int64, lim *fleetrate.Limit, n, reserve int64, maxWait time.Duration, s *State, res *fleetrate.Result) (booked bool) {
	// A one-limit slice over lim, without allocating.
	s.Elapse(now, unsafe.Slice(lim, 1))
	iv := lim.Interval()
	debt := s.Debts[0]
	wait := max(debt-(lim.Burst-(n+reserve))*iv, 0) // see needs
	// Field by field: building a Result aside and copying it is slower.
	*res = fleetrate.Result{}
	res.At, res.N = time.UnixMicro(now), n
	res.Limit.Name, res.Limit.Rate, res.Limit.Burst = lim.Name, lim.Rate, lim.Burst
	if wait > int64(maxWait) {
		res.RetryAfter = time.Duration(wait)
	} else {
		res.Allowed = true
		res.Wait = time.Duration(wait)
		if n > 0 {
			debt = max(debt, wait) + n*iv // see book
			s.Debts[0], booked = debt, true
		}
	}
	if left := lim.Burst*iv - debt; left > 0 { // see status
		res.Remaining = left / iv
	}
	res.ResetAfter = time.Duration(max(debt, 0))
	res.NextToken = time.Duration(max(debt-(lim.Burst-res.Remaining-1)*iv, 0)) // see nextToken
	return booked
}

// nextToken is Result.NextToken for limit l at debt: the time until it
// holds one token more than its whole tokens now.
func nextToken(l *fleetrate.Limit, debt int64) time.Duration {
	iv := l.Interval()
	var rem int64
	if left := l.Burst*iv - debt; left > 0 {
		rem = left / iv
	}
	return time.Duration(max(debt-(l.Burst-rem-1)*iv, 0))
}

// decide is Decide for any number of buckets and limits.
func decide(now int64, req fleetrate.Request, states []State) (fleetrate.Result, bool) {
	need, wb, wl := int64(math.MinInt64), 0, 0
	for b, bk := range req.Buckets {
		states[b].Elapse(now, bk.Limits)
		if w, l := needs(bk.Limits, states[b].Debts, req.N+bk.Reserve); w > need {
			need, wb, wl = w, b, l
		}
	}
	wait := max(need, 0)
	res := fleetrate.Result{At: time.UnixMicro(now), N: req.N}
	if wait > int64(req.MaxWait) {
		res.RetryAfter = time.Duration(wait)
		res.Bucket, res.LimitIndex, res.Limit = wb, wl, plain(&req.Buckets[wb].Limits[wl])
		fillStatus(&res, req, states, false)
		return res, false
	}
	res.Allowed = true
	res.Wait = time.Duration(wait)
	if req.N > 0 {
		for b, bk := range req.Buckets {
			book(bk.Limits, states[b].Debts, req.N, wait)
		}
		if bk := req.Booking; bk != nil {
			bk.Stamp, bk.Debts = now, bk.Debts[:0]
			for b := range req.Buckets {
				bk.Debts = append(bk.Debts, states[b].Debts...)
			}
		}
	}
	fillStatus(&res, req, states, true)
	return res, req.N > 0
}

// fillStatus sets Remaining and ResetAfter from every bucket, and, for an
// allowed take, names the tightest limit as the one that decided; then
// NextToken for the limit that decided.
func fillStatus(res *fleetrate.Result, req fleetrate.Request, states []State, pickTightest bool) {
	res.Remaining = math.MaxInt64
	var reset int64
	for b, bk := range req.Buckets {
		rem, tight, rs := status(bk.Limits, states[b].Debts)
		if rem < res.Remaining {
			res.Remaining = rem
			if pickTightest {
				res.Bucket, res.LimitIndex, res.Limit = b, tight, plain(&bk.Limits[tight])
			}
		}
		reset = max(reset, rs)
	}
	res.ResetAfter = time.Duration(reset)
	res.NextToken = nextToken(&req.Buckets[res.Bucket].Limits[res.LimitIndex], states[res.Bucket].Debts[res.LimitIndex])
}

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
	// A grant older than the longest fill time has been refilled in full
	// by every limit: clamping there keeps el below 2^53, as the Lua
	// mirror needs, and changes no answer.
	el := min(max(now-at, 0), refundHorizonUS) * 1000
	changed := false
	for i := range limits {
		l := &limits[i]
		iv := l.Interval()
		d := s.Debts[i]
		if d <= 0 || d > (l.Burst-min(max(reserve, 0), l.Burst))*iv {
			continue
		}
		// No grant took more than a burst: n × iv is then at most the
		// fill time, below el's clamp.
		back := min(n, l.Burst)*iv - el
		back = min(back, d)
		if back > 0 {
			s.Debts[i] = d - back
			changed = true
		}
	}
	return changed
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
	if len(booked) != len(limits) {
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
			changed = true
		}
	}
	return changed
}

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
// token had been taken at now+d. A drain never shortens an existing debt.
func Drain(now int64, limits []fleetrate.Limit, s *State, d time.Duration) {
	s.Elapse(now, limits)
	for i := range limits {
		s.Debts[i] = max(s.Debts[i], int64(d)+fill(&limits[i]))
	}
}

// TTL returns how long a store must keep the state: until every limit is
// full again, when the state equals an absent one.
func (s *State) TTL() time.Duration {
	var m int64
	for _, d := range s.Debts {
		m = max(m, d)
	}
	return time.Duration(m)
}
