package simulate

import (
	"fmt"
	"slices"
	"time"
)

// Customer is one key of the month scenario's traffic: so many requests a
// weekday and a weekend day, spread over the hours of a working day in the
// period's zone, plus, for the boundary customer, a whole quota just
// before the boundary and a whole quota just after.
type Customer struct {
	// Name is the customer's key.
	Name string
	// Weekday and Weekend are its requests a day.
	Weekday, Weekend int64
	// Straddles is set for the customer who sends Quota requests evenly in
	// the BoundarySpan before the boundary and Quota more in the one
	// after, the first of them exactly at the boundary.
	Straddles bool
	// About says what the customer shows.
	About string
}

// The month scenario's customers.
const (
	Heavy    = "heavy"
	Steady   = "steady"
	Boundary = "boundary"
)

// monthCustomers returns the traffic of c, scaled to its quota: a heavy
// user who spends a month's quota in about ten working days, a steady one
// well within it, and one who spends two quotas across the boundary.
func monthCustomers(c MonthConfig) []Customer {
	q := c.Quota
	return []Customer{
		{Name: Heavy, Weekday: q / 10, Weekend: q / 50, About: "spends the quota in about ten working days"},
		{Name: Steady, Weekday: q * 3 / 100, Weekend: q * 6 / 1000, About: "well within the quota"},
		{Name: Boundary, Weekday: q / 1000, Weekend: q / 1000, Straddles: true,
			About: fmt.Sprintf("plus %d in the %v before the boundary and %d in the %v after", q, short(c.BoundarySpan), q, short(c.BoundarySpan))},
	}
}

// hourWeights is the daily pattern: the share of a day's requests sent in
// each hour, in the period's zone: none at night, a morning peak, a dip
// at lunch.
var hourWeights = [24]int64{7: 1, 8: 3, 9: 6, 10: 8, 11: 8, 12: 4, 13: 6, 14: 8, 15: 8, 16: 7, 17: 5, 18: 3, 19: 2, 20: 1}

// monthRequest is one request: a customer's index and when it is sent.
type monthRequest struct {
	at       time.Time
	customer int
}

// monthTraffic returns every request of the run, in time order (ties in
// customer order). It is deterministic: each hour's share of a day is
// spread evenly over the hour.
func monthTraffic(c MonthConfig, customers []Customer, from, boundary time.Time) []monthRequest {
	var total int64
	for _, w := range hourWeights {
		total += w
	}
	var out []monthRequest
	for ci, cu := range customers {
		for day := range c.Days {
			y, m, d := from.Date()
			date := time.Date(y, m, d+day, 0, 0, 0, 0, from.Location())
			n := cu.Weekday
			if wd := date.Weekday(); wd == time.Saturday || wd == time.Sunday {
				n = cu.Weekend
			}
			var cum int64
			for h, w := range hourWeights {
				// The hour's share, by cumulative rounding so that the day
				// sums to n exactly.
				k := n*(cum+w)/total - n*cum/total
				cum += w
				hour := time.Date(y, m, d+day, h, 0, 0, 0, from.Location())
				for i := range k {
					out = append(out, monthRequest{at: hour.Add(time.Duration((2*i + 1) * int64(time.Hour) / (2 * k))), customer: ci})
				}
			}
		}
		if cu.Straddles {
			for i := range c.Quota {
				off := time.Duration(i * int64(c.BoundarySpan) / c.Quota)
				out = append(out,
					monthRequest{at: boundary.Add(-c.BoundarySpan + off), customer: ci},
					monthRequest{at: boundary.Add(off), customer: ci})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b monthRequest) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return a.customer - b.customer
	})
	return out
}
