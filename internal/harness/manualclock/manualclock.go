// Package manualclock is a clock for tests that moves only when told to,
// safe for concurrent use: stores, limiters and servers take its Now as
// their time source, and a test advances it.
package manualclock

import (
	"sync/atomic"
	"time"
)

// Clock is a manual clock. Create one with New.
type Clock struct {
	ns atomic.Int64 // Unix nanoseconds
}

// New returns a clock that reads t until advanced.
func New(t time.Time) *Clock {
	c := &Clock{}
	c.ns.Store(t.UnixNano())
	return c
}

// Now returns the clock's time (without a monotonic reading).
func (c *Clock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Advance moves the clock d forward (back when d is negative).
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
