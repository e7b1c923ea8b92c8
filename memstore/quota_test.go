package memstore_test

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/memstore"
)

// TestQuotaBoundaries drives a store's clock across the calendar's hard
// boundaries: a quota used up just before its window ends refuses until
// exactly the boundary, on the store's clock, and admits again at it.
// Midnight in UTC; midnight in New York on the days daylight saving
// starts (a 23-hour day) and ends (25 hours); the 31st anchor in a
// 30-day month and in February of a leap year; a week starting Monday;
// the year.
func TestQuotaBoundaries(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	for _, tc := range []struct {
		name           string
		period         string
		boundary, next time.Time // a window's start, and its end
	}{
		{"midnight UTC", "day", time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)},
		{"daylight saving starts: 23 hours", "day America/New_York", time.Date(2026, 3, 8, 0, 0, 0, 0, ny), time.Date(2026, 3, 8, 0, 0, 0, 0, ny).Add(23 * time.Hour)},
		{"daylight saving ends: 25 hours", "day America/New_York", time.Date(2026, 11, 1, 0, 0, 0, 0, ny), time.Date(2026, 11, 1, 0, 0, 0, 0, ny).Add(25 * time.Hour)},
		{"the 31st to a 30-day month", "month day=31", time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)},
		{"a 30-day month back to the 31st", "month day=31", time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC), time.Date(2026, 5, 31, 0, 0, 0, 0, time.UTC)},
		{"the 31st to a leap February", "month day=31", time.Date(2028, 1, 31, 0, 0, 0, 0, time.UTC), time.Date(2028, 2, 29, 0, 0, 0, 0, time.UTC)},
		{"a week from Monday", "week monday", time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 14, 0, 0, 0, 0, time.UTC)},
		{"a leap year: 366 days", "year", time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 1, 1, 0, 0, 0, 0, time.UTC).Add(366 * 24 * time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := calendar.Parse(tc.period)
			if err != nil {
				t.Fatal(err)
			}
			now := tc.boundary.Add(-time.Second)
			s := memstore.New(memstore.Options{Clock: func() time.Time { return now }})
			b := fleetrate.Bucket{Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 1e6)}, Quotas: []fleetrate.Quota{{Count: 2, Period: p}}}
			take := func() fleetrate.Result {
				t.Helper()
				res, err := s.Take(t.Context(), fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			take()
			take()
			res := take()
			if res.Allowed || res.RetryAfter != time.Second || !res.Quotas[0].Reset.Equal(tc.boundary) {
				t.Fatalf("a second before the boundary: %+v, want refused for 1 s, until %v", res, tc.boundary)
			}
			now = tc.boundary.Add(-time.Microsecond)
			if res := take(); res.Allowed {
				t.Fatalf("1 µs before the boundary: %+v, want refused", res)
			}
			now = tc.boundary
			res = take()
			if !res.Allowed || res.Quotas[0].Used != 1 || !res.Quotas[0].Reset.Equal(tc.next) {
				t.Fatalf("at the boundary: %+v, want allowed, 1 used, the window ending %v", res, tc.next)
			}
		})
	}
}
