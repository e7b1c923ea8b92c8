package failsafe_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
)

func ExampleNew() {
	// A Redis that is not there: nothing listens on port 1.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer rdb.Close()
	shared, _ := redisstore.New(rdb, redisstore.Options{Timeout: 50 * time.Millisecond})

	store, _ := failsafe.New(shared, failsafe.Options{
		Name:      "redis",
		Policy:    failsafe.LocalFallback, // decide locally at the shared rate / FleetSize
		FleetSize: 4,
		// The local bucket's clock stands still so the output is stable.
		Fallback: memstore.New(memstore.Options{Clock: func() time.Time { return time.Unix(1_700_000_000, 0) }}),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	lim, _ := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(40, 8)}})
	allowed := 0
	for range 5 {
		if res, err := lim.Allow(context.Background(), "k"); err == nil && res.Allowed && res.Degraded {
			allowed++
		}
	}
	fmt.Println(allowed, "of 5 allowed by the local bucket (burst 8 / 4)")
	// Output: 2 of 5 allowed by the local bucket (burst 8 / 4)
}
