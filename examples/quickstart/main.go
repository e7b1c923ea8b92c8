// Command quickstart is the README's quick start as a program:
//
//	go run ./examples/quickstart                               # in memory
//	go run ./examples/quickstart -redis redis://127.0.0.1:6379 # a fleet
package main

import (
	"context"
	"errors"
	"flag"
	"log"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
)

// main is the quick start in order: pick a store, configure the limiter,
// then Allow, Wait, a take of two buckets and a Drain. It is long because
// it is a tour to read top to bottom, as the README tells it: each step
// uses what the one before made, and a newcomer should not have to jump
// between functions to follow it.
func main() {
	redisURL := flag.String("redis", "", "Redis URL; empty means the in-memory store")
	flag.Parse()
	log.SetFlags(0) // the lines as the README shows them, without a timestamp
	ctx := context.Background()

	// One process: the in-memory store.
	var store fleetrate.Store = memstore.New(memstore.Options{})

	// A fleet: every process points at the same Redis. Any go-redis v9 client
	// works (Client, ClusterClient, Ring, failover, UniversalClient); every
	// call is bounded by a 50 ms timeout. ClientOptions keeps the client
	// dialling while Redis restarts, so decisions resume within about 100 ms
	// of Redis (p99 10-99 ms: docs/OPERATIONS.md, "Recovery after Redis comes back").
	if *redisURL != "" {
		opts, err := redis.ParseURL(*redisURL)
		if err != nil {
			log.Fatal(err)
		}
		redisstore.SetLogger(slog.Default()) // go-redis's own lines: structured, one a second
		rs, err := redisstore.New(redis.NewClient(redisstore.ClientOptions(opts)), redisstore.Options{})
		if err != nil {
			log.Fatal(err)
		}
		// When Redis fails: fail open, fail closed, or decide locally at the
		// shared rate divided by the fleet size, behind a circuit breaker.
		if store, err = failsafe.New(rs, failsafe.Options{Policy: failsafe.LocalFallback, FleetSize: 6}); err != nil {
			log.Fatal(err)
		}
	}

	lim, err := fleetrate.New(store, fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{
			{Name: "{booking_com}/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(20, 40)}},
			{Name: "{booking_com}", Limits: []fleetrate.Limit{fleetrate.PerSecond(30, 30)}}, // credential-wide
		},
		Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 20)}, // any other name, e.g. per API key
	})
	if err != nil {
		log.Fatal(err) // names the invalid field and value
	}

	// Allow never blocks. A denial is a result; an error means the store failed.
	res, err := lim.Allow(ctx, "api-key-hash")
	if err != nil {
		log.Fatal(err) // store down: fail open or closed, your choice
	}
	if !res.Allowed {
		log.Printf("429, Retry-After: %v", res.RetryAfter)
	}
	log.Printf("Allow(api-key-hash): allowed=%v, %d tokens left of %v", res.Allowed, res.Remaining, res.Limit)

	// Wait books a slot and sleeps until it (FIFO across the fleet). A wait
	// beyond the max wait (5 s) fails at once with ErrBackpressure.
	start := time.Now()
	if _, err := lim.Wait(ctx, "{booking_com}/availability"); errors.Is(err, fleetrate.ErrBackpressure) {
		log.Print("back off and reschedule")
	} else if err != nil {
		log.Fatal(err)
	}
	log.Printf("Wait({booking_com}/availability): granted after %v", time.Since(start).Round(time.Millisecond))

	// Take from the endpoint and the credential-wide bucket, all or nothing.
	res, err = lim.WaitN(ctx, 1, "{booking_com}/availability", "{booking_com}")
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("WaitN(endpoint, credential): granted after %v, %d tokens left in the tightest limit (%v)", res.Wait, res.Remaining, res.Limit)

	// An upstream said Retry-After: 2: pause the whole fleet, then refill from empty.
	if err := lim.Drain(ctx, 2*time.Second, "{booking_com}/availability"); err != nil {
		log.Fatal(err)
	}
	res, err = lim.Allow(ctx, "{booking_com}/availability")
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("after Drain(2s): allowed=%v, retry after %v", res.Allowed, res.RetryAfter.Round(time.Millisecond))
}
