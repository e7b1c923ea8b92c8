package overlimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/overlimit"
)

func ExampleNew() {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }               // injected for the example
	shared := memstore.New(memstore.Options{Clock: clock}) // in production, a redisstore
	store := overlimit.New(shared, overlimit.Options{Clock: clock, MaxBytes: 1 << 20})
	lim, _ := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}})
	ctx := context.Background()
	for range 4 {
		res, _ := lim.Allow(ctx, "client:42")
		fmt.Println(res.Allowed, res.RetryAfter)
		now = now.Add(100 * time.Millisecond)
	}
	st := store.Stats()
	fmt.Println("store calls:", st.Misses, "answered by the cache:", st.Hits)
	// Output:
	// true 0s
	// false 900ms
	// false 800ms
	// false 700ms
	// store calls: 2 answered by the cache: 2
}
