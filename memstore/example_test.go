package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

func ExampleNew() {
	now := time.Unix(1_700_000_000, 0)
	store := memstore.New(memstore.Options{
		Clock:   func() time.Time { return now }, // injected for the example
		MaxKeys: 100_000,
	})
	lim, _ := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(2, 2)}})
	ctx := context.Background()
	for range 3 {
		res, _ := lim.Allow(ctx, "user:7")
		fmt.Println(res.Allowed, res.RetryAfter)
	}
	now = now.Add(500 * time.Millisecond) // one token refills
	res, _ := lim.Allow(ctx, "user:7")
	fmt.Println(res.Allowed, store.Len())
	// Output:
	// true 0s
	// true 0s
	// false 500ms
	// true 1
}
