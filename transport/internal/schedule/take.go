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
