package fleetrate

// Giving back what a grant took: the arguments of Store.Refund,
// Store.Cancel and Store.Settle, and their checks.

import (
	"fmt"
	"time"
)

// Settlement is what a grant really cost, bucket by bucket, once the work
// is done (see Store.Settle).
type Settlement struct {
	// Costs are what the grant took from each bucket, in the order of the
	// buckets (Request.Costs, or its N for each).
	Costs []int64
	// Actual are what the work cost each bucket.
	Actual []int64
	// At is when the grant's slot began, on the store's clock: its
	// Result.At plus its Result.Wait.
	At time.Time
}

// ValidateSettle checks the arguments of Store.Settle, naming the failing
// value.
func ValidateSettle(buckets []Bucket, s Settlement) error {
	if err := ValidateBuckets(buckets); err != nil {
		return err
	}
	if len(s.Costs) != len(buckets) || len(s.Actual) != len(buckets) {
		return fmt.Errorf("%w: settle: %d costs and %d actual costs for %d buckets (one each per bucket, in order)", ErrInvalid, len(s.Costs), len(s.Actual), len(buckets))
	}
	if s.At.IsZero() {
		return fmt.Errorf("%w: settle at: the grant's slot (its Result.At plus Result.Wait) is required", ErrInvalid)
	}
	for i, b := range buckets {
		for _, l := range b.Limits {
			if c := s.Costs[i]; c < 0 || c > l.Burst {
				return fmt.Errorf("%w: settle costs[%d]: bucket %q: a grant's cost is between 0 and the burst %d, got %d", ErrInvalid, i, b.StoreKey(), l.Burst, c)
			}
			if a := s.Actual[i]; a < 0 || a > l.Burst {
				return fmt.Errorf("%w: settle actual[%d]: bucket %q: must be between 0 and the burst %d (a limit owes at most one burst beyond a grant), got %d", ErrInvalid, i, b.StoreKey(), l.Burst, a)
			}
		}
	}
	return nil
}

// ValidateRefund checks the arguments of Store.Refund: valid buckets, n
// between 0 and MaxBurst, and the grant's time.
func ValidateRefund(buckets []Bucket, n int64, at time.Time) error {
	if err := ValidateBuckets(buckets); err != nil {
		return err
	}
	if n < 0 || n > MaxBurst {
		return fmt.Errorf("%w: refund n must be between 0 and %d, got %d", ErrInvalid, int64(MaxBurst), n)
	}
	if at.IsZero() {
		return fmt.Errorf("%w: refund at: the grant's time (its Result.At) is required: without it a refund could give back tokens the bucket has refilled since", ErrInvalid)
	}
	return nil
}

// ValidateCancel checks the arguments of Store.Cancel: valid buckets, n at
// least 0 (0 when the booking has costs by bucket), and a booking with one
// debt for every limit of the buckets.
func ValidateCancel(buckets []Bucket, n int64, b Booking) error {
	if err := ValidateBuckets(buckets); err != nil {
		return err
	}
	if n < 0 {
		return fmt.Errorf("%w: cancel n must be >= 0, got %d", ErrInvalid, n)
	}
	if b.Costs != nil && (n != 0 || len(b.Costs) != len(buckets)) {
		return fmt.Errorf("%w: cancel: a booking with costs by bucket takes n 0 and one cost per bucket, got n %d and %d costs for %d buckets", ErrInvalid, n, len(b.Costs), len(buckets))
	}
	m := 0
	for i, bk := range buckets {
		m += len(bk.Limits)
		c := CostOf(n, b.Costs, i)
		for _, l := range bk.Limits {
			if c < 0 || c > l.Burst {
				// No take of more than a burst books anything.
				return fmt.Errorf("%w: cancel n must be between 0 and the burst of every limit (a take of more books nothing), got %d for %s", ErrInvalid, c, l)
			}
		}
	}
	if len(b.Debts) != m {
		return fmt.Errorf("%w: cancel booking: %d debts for %d limits (a booking from another take?)", ErrInvalid, len(b.Debts), m)
	}
	return nil
}
