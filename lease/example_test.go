package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/memstore"
)

func ExampleNew() {
	// shared stands for the fleet's Redis store; its clock stands still so
	// that the output is stable.
	shared := memstore.New(memstore.Options{Clock: func() time.Time { return time.Unix(1_700_000_000, 0) }})
	store, err := lease.New(shared, lease.Options{Tokens: 10, MaxAge: 50 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 20)}})
	if err != nil {
		panic(err)
	}
	allowed := 0
	for range 10 {
		if res, err := lim.Allow(context.Background(), "booking_com"); err == nil && res.Allowed {
			allowed++
		}
	}
	// One lease of 10 tokens from the shared bucket served all ten.
	peek, _ := shared.Take(context.Background(), fleetrate.Request{
		Buckets: []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "booking_com", Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 20)}}},
	})
	fmt.Println(allowed, "allowed; the shared bucket has", peek.Remaining, "left")
	// Output: 10 allowed; the shared bucket has 10 left
}
