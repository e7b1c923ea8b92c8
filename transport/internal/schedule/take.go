package schedule

import (
	"context"
	"slices"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/hold"
)

// take books the request's take tk, at most horizon ahead, through the
// Limiter: its costs by bucket when it has them (each pause marker costs
// one token, a nanosecond), and an in-flight permit when a paced bucket
// bounds them. Without a free permit, Limiter.Book waits in the buckets'
// queue, first come first served: within what is left of the request's
// budget, which the take's context carries as its deadline.
func (q *Request) take(ctx context.Context, tk hold.Take, horizon time.Duration) (*fleetrate.Reservation, error) {
	req := fleetrate.Request{Buckets: tk.Buckets, N: q.N, MaxWait: horizon}
	if q.Costs != nil {
		req.N, req.Costs = 0, make([]int64, len(tk.Buckets))
		copy(req.Costs, q.Costs)
		for i := len(q.Costs); i < len(req.Costs); i++ {
			req.Costs[i] = 1
		}
	}
	if slices.ContainsFunc(q.Paced, func(b fleetrate.Bucket) bool { return b.InFlight > 0 }) {
		dctx, cancel := context.WithTimeout(ctx, q.Remaining())
		defer cancel()
		ctx = dctx
	}
	return q.Limiter.Book(ctx, req)
}

// permitRetry reports whether a multi-bucket take refused bp found no
// in-flight permit free and its tokens beyond the look-ahead, and how
// long to sleep before taking again. Such a take does not join the
// permit's queue (it books only within the look-ahead), and its
// RetryAfter is the later of its tokens' turn and the end of the first
// lease held, which a release usually comes well before: so it takes
// again each look-ahead, within the budget, rather than fail at once on
// the lease's end.
func (q *Request) permitRetry(bp *fleetrate.BackpressureError, horizon time.Duration) (time.Duration, bool) {
	in := bp.Result.InFlight
	if len(q.Paced) < 2 || in.Bound == 0 || in.Held < in.Bound || bp.MaxWait < horizon {
		return 0, false
	}
	left := q.Remaining()
	if left <= horizon {
		return 0, false
	}
	return max(min(bp.RetryAfter-horizon, q.Lookahead, left-horizon), time.Millisecond), true
}
