package transport

import (
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport/internal/sendtime"
)

// SpacingMargin returns what the spacing gate adds to an endpoint's
// Spacing: a millisecond, or a twentieth of spacing when that is less. A
// request may leave this much later than the gate let it go, or come back
// this much later than the endpoint's quickest recent answer, without
// holding the gate: the gate's interval already covers it.
func SpacingMargin(spacing time.Duration) time.Duration {
	return sendtime.Margin(spacing)
}

// checkSpacing checks an endpoint's Spacing against its bounds and its
// limits, which must have burst 1 and pace at most as fast as the gate,
// naming field.
func checkSpacing(e Endpoint, field string) error {
	if e.Spacing == 0 {
		return nil
	}
	if err := sendtime.CheckSpacing(e.Spacing); err != nil {
		return fmt.Errorf("%w: %s.spacing: %w", fleetrate.ErrInvalid, field, err)
	}
	gate := sendtime.GateLimit(e.Spacing)
	for j, l := range e.Limits {
		if l.Burst != 1 {
			return fmt.Errorf("%w: %s.limits[%d]: burst must be 1 with a spacing (a strict window has none), got %d", fleetrate.ErrInvalid, field, j, l.Burst)
		}
		if l.Rate > gate.Rate {
			return fmt.Errorf("%w: %s.limits[%d]: rate %v/s is faster than spacing %v lets through (at most %.4g/s: one request per spacing + %v, its margin)",
				fleetrate.ErrInvalid, field, j, l.Rate, e.Spacing, gate.Rate, SpacingMargin(e.Spacing))
		}
	}
	return nil
}
