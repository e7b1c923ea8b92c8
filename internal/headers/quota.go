package headers

import (
	"time"

	"github.com/fleetrate/fleetrate"
)

// This file turns a token bucket into the numbers of the ratelimit-headers
// draft, which speaks of quotas per window in whole seconds. Every number
// is rounded in the direction that keeps what it promises true. httplimit
// and the RLS of fleetrate serve both send these numbers, so that one
// bucket is described the same way by either; the property test in
// httplimit/quota_test.go holds the promises against the bucket's real
// decisions.

// QuotaWindow converts a limit to the "q" (in tokens) and "w" (in seconds)
// of its RateLimit-Policy item. The promises, for a bucket that refills
// one token every iv nanoseconds and holds burst tokens, taking its fill
// time F = burst·iv:
//
//   - Rate: the bucket refills at least q tokens in every w seconds
//     (q·iv ≤ w s), so a client that paces itself at q per w is never
//     refused.
//   - Window, when F is at least one second: q ≤ burst too, so any q
//     tokens spent within any w seconds are admitted, however bunched.
//     w is F rounded down or up to whole seconds, whichever gives the
//     higher rate; when F is whole seconds, q is the burst and w is F.
//     The rate q/w is then at least F/(F+1s) of the bucket's, at least half.
//   - Rate only, when F is under one second: w is 1 and q the tokens the
//     bucket refills in a second, rounded down, as seen through the stores'
//     microsecond clocks (see PacedInterval), so q/w is that rate less under
//     one token per second. q is then above the burst, and the burst shows
//     as the "r" of a client's first response instead.
func QuotaWindow(iv, burst int64) (q, w int64) {
	const s = int64(time.Second)
	fill := burst * iv // at most MaxFillTime: no overflow
	if fill < s {
		return s / PacedInterval(iv, burst), 1
	}
	hi := (fill + s - 1) / s
	q, w = burst, hi // q·iv = fill ≤ hi seconds
	if lo := fill / s; lo < hi {
		// Fewer seconds may carry a higher rate: q/w > burst/hi.
		if ql := min(burst, lo*s/iv); ql > 0 && ql*hi > burst*lo {
			q, w = ql, lo
		}
	}
	return q, w
}

// PacedInterval returns the shortest spacing at which requests of one token
// each, arriving at any instants, are all admitted by a bucket that refills
// one token every iv ns and holds burst tokens. The stores read time in
// whole microseconds (Redis's TIME, and memstore likewise), so two arrivals
// d apart may be seen up to 1 µs closer. When the burst minus one token
// already covers that (burst−1)·iv ≥ 1 µs, the spacing is iv. Otherwise
// it is the smaller of iv rounded up to whole microseconds (then the k-th
// arrival is seen at least k·iv after the first) and iv plus the missing
// part of that microsecond.
func PacedInterval(iv, burst int64) int64 {
	const us = int64(time.Microsecond)
	slack := (burst - 1) * iv // below the fill time: no overflow
	if slack >= us {
		return iv
	}
	return min((iv+us-1)/us*us, iv+us-slack)
}

// EffectiveWindow returns the "t" of a RateLimit item for a decision of a
// bucket of nlimits limits, reporting remaining tokens ("r"): the longest
// whole number of seconds within which the client can use no more than
// remaining tokens.
//
// "r" is the fewest tokens of any limit. For a grant (a peek included),
// and for any decision of a bucket of one limit, the limit that decided is
// the one holding "r", and until its next token, which the store computed
// (Result.NextToken), no request can use more than "r": t is that time
// rounded down (under a second short of the truth). A refusal by one of
// several limits names the limit that refused, which need not hold "r";
// t is then 0 (nothing is promised beyond "r" now), except for a refusal
// of one token, when no request can be admitted before RetryAfter.
//
// For a refusal the caller also bounds t by RetryAfter: the draft wants
// the effective window to end no later than Retry-After.
func EffectiveWindow(nlimits int, remaining int64, res fleetrate.Result) time.Duration {
	var next time.Duration
	switch {
	case nlimits == 1 || res.Allowed:
		next = res.NextToken
	case res.N == 1 && remaining == 0:
		next = res.RetryAfter
	}
	return max(next, 0).Truncate(time.Second)
}
