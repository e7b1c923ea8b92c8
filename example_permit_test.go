package fleetrate_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// An upstream allows 2 requests in flight per credential: a third waits,
// first come first served, and a release hands the permit on.
func ExampleLimiter_TryAcquire() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "booking_com", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}, InFlight: 2},
	}})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	var held []*fleetrate.Reservation
	for range 3 {
		r, err := lim.TryAcquire(ctx, "booking_com")
		if err != nil {
			panic(err)
		}
		fmt.Println(r.Result.Allowed, r.Result.InFlight.Held, "of", r.Result.InFlight.Bound)
		if r.Result.Allowed {
			held = append(held, r)
		}
	}
	_ = held[0].Release(ctx)
	r, _ := lim.TryAcquire(ctx, "booking_com")
	fmt.Println(r.Result.Allowed, "after a release")
	// Output:
	// true 1 of 2
	// true 2 of 2
	// false 2 of 2
	// true after a release
}

// An LLM API limits requests and tokens per minute on one key: take both
// at once with an estimate, then settle to what the answer says it used.
func ExampleReservation_Settle() {
	store := memstore.New(memstore.Options{Clock: fixedClock})
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{sk-1}:requests", Limits: []fleetrate.Limit{fleetrate.PerPeriod(500, time.Minute)}},
		{Name: "{sk-1}:tokens", Limits: []fleetrate.Limit{fleetrate.PerPeriod(30_000, time.Minute)}},
	}})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	r, err := lim.WaitCosts(ctx,
		fleetrate.Cost{Bucket: "{sk-1}:requests", N: 1},
		fleetrate.Cost{Bucket: "{sk-1}:tokens", N: 2_000}) // the estimate
	if err != nil {
		panic(err)
	}
	// ... call the API; its answer reports 2,600 tokens used.
	if err := r.Settle(ctx, fleetrate.Cost{Bucket: "{sk-1}:tokens", N: 2_600}); err != nil {
		panic(err)
	}
	res, _ := lim.Peek(ctx, "{sk-1}:tokens")
	fmt.Println(res.Remaining, "tokens left")
	fmt.Println(r.Settle(ctx) != nil, "(a settle applies once)")
	// Output:
	// 27400 tokens left
	// true (a settle applies once)
}
