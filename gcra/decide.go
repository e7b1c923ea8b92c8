package gcra

import (
	"math"
	"slices"
	"time"
	"unsafe"

	"github.com/fleetrate/fleetrate"
)

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
		debts[i] = max(debts[i], grain(wait, fill(&limits[i]))) + n*limits[i].Interval()
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
	if len(req.Buckets) == 1 && len(req.Buckets[0].Limits) == 1 && req.Booking == nil && req.Costs == nil && req.Buckets[0].InFlight == 0 && len(req.Buckets[0].Quotas) == 0 {
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
			s.noteTakes(now, unsafe.Slice(lim, 1), wait)
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

// decide is Decide for any number of buckets and limits, costs by bucket
// and in-flight permits.
func decide(now int64, req fleetrate.Request, states []State) (fleetrate.Result, bool) {
	need, wb, wl := int64(math.MinInt64), 0, 0
	for b, bk := range req.Buckets {
		states[b].Elapse(now, bk.Limits)
		if w, l := needs(bk.Limits, states[b].Debts, fleetrate.CostOf(req.N, req.Costs, b)+bk.Reserve); w > need {
			need, wb, wl = w, b, l
		}
	}
	wait := max(need, 0)
	res := fleetrate.Result{At: time.UnixMicro(now), N: fleetrate.CostOf(req.N, req.Costs, wb)}
	blocked, ahead := admit(now, req, states)
	if !hasQuotas(req) {
		return decideTokens(now, req, states, res, wait, wb, wl, blocked, ahead)
	}
	rb, ri, qwait := quotaRefusal(now, req, states)
	if rb < 0 {
		res, changed := decideTokens(now, req, states, res, wait, wb, wl, blocked, ahead)
		if res.Allowed {
			changed = useQuotas(now, req, states) || changed
		}
		fillQuotas(&res, now, req, states, -1, -1)
		return res, changed
	}
	// A quota refuses: denied whatever the max wait (a quota is not
	// booked ahead), until its window ends, or longer when the tokens or
	// a permit need longer. The take joins no queue.
	res.RetryAfter = max(time.Duration(wait), time.Duration(qwait))
	if blocked >= 0 {
		res.RetryAfter = max(res.RetryAfter, time.Duration(states[blocked].Permits.Wait(now))*time.Microsecond)
	}
	res.Bucket, res.LimitIndex, res.Limit = wb, wl, plain(&req.Buckets[wb].Limits[wl])
	fillStatus(&res, req, states, false)
	fillInFlight(&res, req, states, blocked)
	fillQuotas(&res, now, req, states, rb, ri)
	return res, false
}

// decideTokens is decide once every quota admits the take: the tokens
// and the permits decide, wait ns from now for the tokens of bucket wb's
// limit wl, the permits blocked in bucket blocked (-1: none) with ahead
// waiting before the take.
func decideTokens(now int64, req fleetrate.Request, states []State, res fleetrate.Result, wait int64, wb, wl, blocked, ahead int) (fleetrate.Result, bool) {
	switch {
	case wait > int64(req.MaxWait):
		res.RetryAfter = time.Duration(wait)
		if blocked >= 0 {
			res.RetryAfter = max(res.RetryAfter, time.Duration(states[blocked].Permits.Wait(now))*time.Microsecond)
		}
	case blocked >= 0:
		// No permit is free: wait in the queue when the take may wait,
		// at most until a held lease ends or a waiter's place lapses (one
		// stopped at the head of the queue holds back those behind it
		// until then, with permits free).
		res.RetryAfter = time.Duration(states[blocked].Permits.Wait(now)) * time.Microsecond
		queued := req.MaxWait > 0
		if queued {
			ahead = enqueue(now, req, states, blocked)
		}
		res.Bucket, res.LimitIndex, res.Limit = wb, wl, plain(&req.Buckets[wb].Limits[wl])
		fillStatus(&res, req, states, false)
		fillInFlight(&res, req, states, blocked)
		res.InFlight.Queued, res.InFlight.Ahead = queued, ahead
		return res, queued
	default:
		return grant(now, req, states, wait, res)
	}
	res.Bucket, res.LimitIndex, res.Limit = wb, wl, plain(&req.Buckets[wb].Limits[wl])
	fillStatus(&res, req, states, false)
	fillInFlight(&res, req, states, blocked)
	return res, false
}

// grant books an allowed take wait ns from now: its tokens in every limit
// and its permit in every bucket that bounds in-flight takes.
func grant(now int64, req fleetrate.Request, states []State, wait int64, res fleetrate.Result) (fleetrate.Result, bool) {
	res.Allowed = true
	res.Wait = time.Duration(wait)
	changed := false
	for b, bk := range req.Buckets {
		if n := fleetrate.CostOf(req.N, req.Costs, b); n > 0 {
			states[b].noteTakes(now, bk.Limits, wait)
			book(bk.Limits, states[b].Debts, n, wait)
			changed = true
		}
		if bk.InFlight > 0 && req.Permit.ID != "" {
			states[b].Permits.Grant(req.Permit.ID, now+int64(req.Permit.TTL/time.Microsecond))
			changed = true
		}
	}
	if bk := req.Booking; bk != nil && changed {
		bk.Stamp, bk.Debts, bk.Costs = now, bk.Debts[:0], slices.Clone(req.Costs)
		for b := range req.Buckets {
			bk.Debts = append(bk.Debts, states[b].Debts...)
		}
	}
	fillStatus(&res, req, states, true)
	res.N = fleetrate.CostOf(req.N, req.Costs, res.Bucket)
	fillInFlight(&res, req, states, -1)
	return res, changed
}

// admit expires the leases of every bucket that bounds in-flight takes
// and, for a take with a permit, returns the first bucket that has no
// permit free for it (or -1) and how many wait there ahead of it.
func admit(now int64, req fleetrate.Request, states []State) (blocked, ahead int) {
	blocked = -1
	for b, bk := range req.Buckets {
		if bk.InFlight == 0 {
			continue
		}
		states[b].Permits.Expire(now)
		if req.Permit.ID == "" || blocked >= 0 {
			continue
		}
		if ok, a := states[b].Permits.Admit(req.Permit.ID, bk.InFlight, bk.PermitReserve); !ok {
			blocked, ahead = b, a
		}
	}
	return blocked, ahead
}

// enqueue puts a take that found no permit free in the queue of every
// bucket that bounds in-flight takes and does not admit it, until its
// lease ends, and returns how many wait ahead of it in bucket blocked.
func enqueue(now int64, req fleetrate.Request, states []State, blocked int) (ahead int) {
	exp := now + int64(req.Permit.TTL/time.Microsecond)
	for b, bk := range req.Buckets {
		if bk.InFlight == 0 {
			continue
		}
		if ok, _ := states[b].Permits.Admit(req.Permit.ID, bk.InFlight, bk.PermitReserve); ok && b != blocked {
			continue
		}
		if a := states[b].Permits.Enqueue(req.Permit.ID, exp, bk.PermitReserve); b == blocked {
			ahead = a
		}
	}
	return ahead
}

// fillInFlight sets res.InFlight from the bucket that bounds in-flight
// takes with the fewest permits free, or from bucket blocked when it is
// not -1.
func fillInFlight(res *fleetrate.Result, req fleetrate.Request, states []State, blocked int) {
	best := blocked
	if best < 0 {
		free := int64(math.MaxInt64)
		for b, bk := range req.Buckets {
			if f := bk.InFlight - int64(len(states[b].Permits.Held)); bk.InFlight > 0 && f < free {
				best, free = b, f
			}
		}
	}
	if best < 0 {
		return
	}
	res.InFlight = fleetrate.InFlight{Bound: req.Buckets[best].InFlight, Held: int64(len(states[best].Permits.Held)), Bucket: best}
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
