package fleetrate

import (
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate/calendar"
)

// MaxQuotaCount is the largest Quota.Count: counts stay exact in a
// double, as the Redis scripts keep them.
const MaxQuotaCount = 1 << 50

// Quota is a calendar quota of a bucket: at most Count tokens taken in
// each window of a calendar period ("10,000 a month, resetting on the
// 1st"; "1,000 a day, resetting at midnight in Asia/Tokyo"), all of them
// back at the window's start, not refilled as time passes. A bucket holds
// its quotas beside its token-bucket limits, which smooth the minute: a
// take is granted when every limit and every quota of every bucket admits
// it, in one atomic step on the store's clock, which also decides the
// window a take falls in.
//
// A quota counts what was granted: Cancel, Refund and Settle give tokens
// back to the token-bucket limits, never to a quota, which so never admits
// more than its count, and may count a booking cancelled before its slot.
// A take that a quota refuses is denied
// whatever its max wait, with Result.RetryAfter until the window ends: a
// quota is not booked ahead. A take granted with a wait counts in the
// window it was granted in. A change of Count keeps what the window used
// (a plan upgraded mid-month keeps the month's use); a change of Period
// starts counting afresh.
type Quota struct {
	// Name labels the quota in results, headers and usage, e.g. "month".
	// It is optional.
	Name string
	// Count is how many tokens each window admits: 1 to MaxQuotaCount.
	Count int64
	// Period is the calendar period whose windows the quota resets at.
	Period calendar.Period
}

// Validate checks the quota, naming the failing field.
func (q Quota) Validate() error {
	if q.Count < 1 || q.Count > MaxQuotaCount {
		return fmt.Errorf("%w: quota %s count: must be between 1 and %d, got %d", ErrInvalid, q.label(), int64(MaxQuotaCount), q.Count)
	}
	if err := q.Period.Validate(); err != nil {
		return fmt.Errorf("%w: quota %s period: %w", ErrInvalid, q.label(), err)
	}
	return nil
}

// label names q in errors.
func (q Quota) label() string {
	if q.Name != "" {
		return fmt.Sprintf("%q", q.Name)
	}
	return fmt.Sprintf("%q", q.Period.String())
}

// Key identifies the quota's use in a store: its period as
// calendar.Parse reads it, so that a change of Count keeps what was used
// and a change of Period does not.
func (q Quota) Key() string { return q.Period.String() }

// String describes the quota, e.g. "10000/month".
func (q Quota) String() string { return fmt.Sprintf("%d/%s", q.Count, q.Period) }

// QuotaStatus is where one quota of a take's bucket stands after a
// decision.
type QuotaStatus struct {
	// Bucket is the index in Request.Buckets of the bucket holding the
	// quota, and Index that of the quota in its Quotas.
	Bucket, Index int
	// Quota is the quota.
	Quota Quota
	// Used is what the window has used, this take included when granted;
	// Remaining is Count less Used (never below 0).
	Used, Remaining int64
	// Reset is when the window ends and the quota is whole again, on the
	// store's clock.
	Reset time.Time
}
