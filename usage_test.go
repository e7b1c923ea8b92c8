package fleetrate_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/memstore"
)

// TestUsageIsWhatTheNextTakesGet is the usage API's property: on a store
// whose clock stands still, after any takes, Usage's Available is exactly
// how many takes of one token are granted next, its quotas' Used is what
// was granted in their windows, and each quota's Reset is its window's end.
func TestUsageIsWhatTheNextTakesGet(t *testing.T) {
	rng := rand.New(rand.NewPCG(40, 41))
	month, _ := calendar.Parse("month day=15 Europe/Paris")
	for run := range 300 {
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(3 * 365 * 24 * time.Hour))))
		s := memstore.New(memstore.Options{Clock: func() time.Time { return now }})
		day, hour := 3+rng.Int64N(28), 3+rng.Int64N(28)
		cfg := fleetrate.Config{Buckets: []fleetrate.BucketConfig{{
			Name:   "key",
			Limits: []fleetrate.Limit{fleetrate.Every(time.Hour, hour)},
			Quotas: []fleetrate.Quota{{Name: "day", Count: day, Period: calendar.Period{Unit: calendar.Day}}, {Name: "month", Count: 3 + rng.Int64N(28), Period: month}},
		}}}
		lim, err := fleetrate.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		granted := int64(0)
		for range rng.IntN(40) {
			res, err := lim.AllowN(ctx, 1+rng.Int64N(3), "key")
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				granted += res.N
			}
		}
		u, err := lim.Usage(ctx, "key")
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range u.Quotas {
			_, end := q.Quota.Period.Window(now)
			if q.Used != granted || q.Remaining != max(q.Quota.Count-granted, 0) || !q.Reset.Equal(end) {
				t.Fatalf("run %d: quota %s: %+v; want %d used, reset at %v", run, q.Quota.Name, q, granted, end)
			}
		}
		next := int64(0)
		for {
			res, err := lim.Allow(ctx, "key")
			if err != nil {
				t.Fatal(err)
			}
			if !res.Allowed {
				break
			}
			next++
		}
		if next != u.Available() {
			t.Fatalf("run %d: usage said %d available (%+v), the next takes got %d", run, u.Available(), u, next)
		}
	}
}

// ExampleLimiter_Usage: a plan of 1,000 messages a month (resetting on
// the 1st) smoothed to 10 a minute, and what a customer's usage page
// shows after three messages.
func ExampleLimiter_Usage() {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Options{Clock: func() time.Time { return now }})
	monthly, _ := calendar.Parse("month day=1")
	lim, _ := fleetrate.New(store, fleetrate.Config{Buckets: []fleetrate.BucketConfig{{
		Name:   "key:alice",
		Limits: []fleetrate.Limit{fleetrate.Every(time.Minute, 10)},
		Quotas: []fleetrate.Quota{{Name: "month", Count: 1000, Period: monthly}},
	}}})
	ctx := context.Background()
	for range 3 {
		_, _ = lim.Allow(ctx, "key:alice")
	}
	u, _ := lim.Usage(ctx, "key:alice")
	q := u.Quotas[0]
	fmt.Printf("%s: %d used, %d left, resets %s\n", q.Quota.Name, q.Used, q.Remaining, q.Reset.Format(time.DateOnly))
	fmt.Printf("now: %d of %d a minute, %d available\n", u.Remaining, u.Limit.Burst, u.Available())
	// Output:
	// month: 3 used, 997 left, resets 2027-01-01
	// now: 7 of 10 a minute, 7 available
}
