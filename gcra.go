package fleetrate

import "time"

// This file is the whole token-bucket algorithm. It is pure: time comes in
// as an argument and state goes out as a value. The memory store calls it
// directly and redisstore's Lua scripts mirror it line for line; the
// conformance and property tests hold the two to the same answers.
//
// Each limit keeps one number, its debt: how far, in nanoseconds, its
// theoretical arrival time (TAT) lies ahead of the bucket's stamp. A limit
// with interval T (ns per token) and burst b has tolerance tau = b*T. At
// time now the limit holds (tau - debt)/T tokens, so debt 0 means full and
// debt tau means empty. This is GCRA, the exact token bucket: refill is
// lazy (the debt shrinks by the elapsed time) and the take is one addition.
// A whole bucket is a stamp plus one debt per limit; no floats, no drift.

// BucketState is what a store keeps for one bucket.
type BucketState struct {
	// Stamp is the store's clock, in microseconds since the Unix epoch, at
	// which Debts were computed.
	Stamp int64
	// Debts holds each limit's debt in nanoseconds, in the order of the
	// bucket's limits. Nil or a length that does not match the limits means
	// the bucket is full (absent, or its limits changed).
	Debts []int64
}

// Elapse advances s to now (µs), refilling every limit by the elapsed time.
// A clock that went backwards refills nothing. n is the number of limits;
// a state whose length does not match is replaced by a full bucket.
func (s *BucketState) Elapse(now int64, n int) {
	if len(s.Debts) != n {
		s.Debts = make([]int64, n)
		s.Stamp = now
		return
	}
	if now > s.Stamp {
		el := now - s.Stamp
		if el > int64(MaxFillTime+MaxWaitCap)/1000 {
			el = int64(MaxFillTime+MaxWaitCap) / 1000
		}
		el *= 1000
		for i, d := range s.Debts {
			if d -= el; d < 0 {
				d = 0
			}
			s.Debts[i] = d
		}
	}
	s.Stamp = now
}

// needs returns how long from now (ns) until n tokens conform in every
// limit of this bucket, which may be negative, and the limit that needs the
// longest.
func needs(limits []Limit, debts []int64, n int64) (need int64, worst int) {
	need = minInt64
	for i, l := range limits {
		iv := l.Interval()
		// (Burst-n)*T first keeps every intermediate below 2^53, as the Lua
		// mirror needs; n <= Burst is validated.
		if w := debts[i] - (l.Burst-n)*iv; w > need {
			need, worst = w, i
		}
	}
	return need, worst
}

// book consumes n tokens in every limit for a grant that happens wait ns
// from now. Booking every limit at the same moment keeps each limit exact
// even when another limit delays the grant.
func book(limits []Limit, debts []int64, n, wait int64) {
	for i, l := range limits {
		debts[i] = max(debts[i], wait) + n*l.Interval()
	}
}

// status reports the tokens left in the tightest limit, which limit that is,
// and how long until every limit is full.
func status(limits []Limit, debts []int64) (remaining int64, tightest int, reset int64) {
	remaining = maxInt64
	for i, l := range limits {
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

const (
	minInt64 = -1 << 63
	maxInt64 = 1<<63 - 1
)

// Decide applies one take of req.N tokens, all or nothing, across every
// bucket in req at time now (the store's clock, µs since the epoch). The
// states must be in the order of req.Buckets and are updated in place; the
// second result reports whether they changed and must be written back.
//
// The take conforms when the wait until n tokens are available in every
// limit is at most req.MaxWait. Then all limits are booked at that moment
// and the result is allowed with Wait set; otherwise nothing changes and
// RetryAfter says how long until the take would conform. N = 0 peeks.
//
// Decide assumes a validated request.
func Decide(now int64, req Request, states []BucketState) (Result, bool) {
	if len(req.Buckets) == 1 && len(req.Buckets[0].Limits) == 1 {
		var res Result
		changed := decideOne(now, &req.Buckets[0].Limits[0], req.N, req.MaxWait, &states[0], &res)
		return res, changed
	}
	return decide(now, req, states)
}

// DecideOne is Decide for a take from a single bucket, for a store's hot
// path: limits are the bucket's, s its state, and the result is written
// into *res rather than returned. It reports whether s changed. It is the
// same as Decide(now, Request{Buckets: []Bucket{{Limits: limits}}, N: n,
// MaxWait: maxWait}, []BucketState{*s}) without the slices and the copies
// of the Result. It assumes a validated request and keeps no pointer.
func DecideOne(now int64, limits []Limit, n int64, maxWait time.Duration, s *BucketState, res *Result) bool {
	if len(limits) == 1 {
		return decideOne(now, &limits[0], n, maxWait, s, res)
	}
	bs, states := [1]Bucket{{Limits: limits}}, [1]BucketState{*s}
	r, changed := decide(now, Request{Buckets: bs[:], N: n, MaxWait: maxWait}, states[:])
	*s, *res = states[0], r
	return changed
}

// decideOne is Decide for one bucket with one limit, the common case: the
// same steps as decide, with the loops over buckets and limits unrolled.
func decideOne(now int64, lim *Limit, n int64, maxWait time.Duration, s *BucketState, res *Result) (booked bool) {
	s.Elapse(now, 1)
	iv := lim.interval()
	debt := s.Debts[0]
	wait := max(debt-(lim.Burst-n)*iv, 0) // see needs
	// Field by field: building a Result aside and copying it is slower.
	*res = Result{}
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
	return booked
}

// decide is Decide for any number of buckets and limits.
func decide(now int64, req Request, states []BucketState) (Result, bool) {
	need, wb, wl := int64(minInt64), 0, 0
	for b, bk := range req.Buckets {
		states[b].Elapse(now, len(bk.Limits))
		if w, l := needs(bk.Limits, states[b].Debts, req.N); w > need {
			need, wb, wl = w, b, l
		}
	}
	wait := max(need, 0)
	res := Result{At: time.UnixMicro(now), N: req.N}
	if wait > int64(req.MaxWait) {
		res.RetryAfter = time.Duration(wait)
		res.Bucket, res.Limit = wb, req.Buckets[wb].Limits[wl].plain()
		fillStatus(&res, req, states, false)
		return res, false
	}
	res.Allowed = true
	res.Wait = time.Duration(wait)
	if req.N > 0 {
		for b, bk := range req.Buckets {
			book(bk.Limits, states[b].Debts, req.N, wait)
		}
	}
	fillStatus(&res, req, states, true)
	return res, req.N > 0
}

// fillStatus sets Remaining and ResetAfter from every bucket, and, for an
// allowed take, names the tightest limit as the one that decided.
func fillStatus(res *Result, req Request, states []BucketState, pickTightest bool) {
	res.Remaining = maxInt64
	var reset int64
	for b, bk := range req.Buckets {
		rem, tight, rs := status(bk.Limits, states[b].Debts)
		if rem < res.Remaining {
			res.Remaining = rem
			if pickTightest {
				res.Bucket, res.Limit = b, bk.Limits[tight].plain()
			}
		}
		reset = max(reset, rs)
	}
	res.ResetAfter = time.Duration(reset)
}

// Refund returns n tokens to every limit of the state (at now, µs): the
// inverse of a take, used when a reservation is cancelled. A bucket never
// holds more than its burst.
func Refund(now int64, limits []Limit, s *BucketState, n int64) {
	s.Elapse(now, len(limits))
	for i, l := range limits {
		// Compare before multiplying: n*T can overflow for a huge n.
		if iv := l.Interval(); n > s.Debts[i]/iv {
			s.Debts[i] = 0
		} else {
			s.Debts[i] -= n * iv
		}
	}
}

// Drain empties every limit of the state until d from now (µs): the bucket
// admits nothing before now+d and then refills from empty, as if every
// token had been taken at now+d. A drain never shortens an existing debt.
func Drain(now int64, limits []Limit, s *BucketState, d time.Duration) {
	s.Elapse(now, len(limits))
	for i, l := range limits {
		s.Debts[i] = max(s.Debts[i], int64(d)+l.Burst*l.Interval())
	}
}

// TTL returns how long a store must keep the state: until every limit is
// full again, when the state equals an absent one.
func (s *BucketState) TTL() time.Duration {
	var m int64
	for _, d := range s.Debts {
		m = max(m, d)
	}
	return time.Duration(m)
}
