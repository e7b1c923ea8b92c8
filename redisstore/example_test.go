package redisstore_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/redisstore"
)

// Every process of the fleet builds the same limiter over the same Redis.
// A Cluster client works the same way; give buckets taken together a
// common {hash tag}.
func ExampleNew() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	store, err := redisstore.New(rdb, redisstore.Options{
		Timeout: 50 * time.Millisecond, // the default: a dead Redis costs at most this
		Batch:   true,                  // concurrent takes share script calls
	})
	if err != nil {
		log.Fatal(err)
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{booking_com}/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(20, 40)}},
		{Name: "{booking_com}", Limits: []fleetrate.Limit{fleetrate.PerSecond(30, 30)}},
	}})
	if err != nil {
		log.Fatal(err)
	}
	// Endpoint and credential-wide bucket, all or nothing, on Redis's clock.
	res, err := lim.WaitN(context.Background(), 1, "{booking_com}/availability", "{booking_com}")
	if err != nil {
		log.Print(err) // wraps fleetrate.ErrStoreUnavailable when Redis fails
		return
	}
	fmt.Println(res.Allowed)
}

// A process that decides as soon as it starts warms its store first: the
// scripts loaded and connections open, its first decisions are one round
// trip each, like every later one.
func ExampleStore_Warm() {
	rdb := redis.NewClient(&redis.Options{
		Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true,
		MinIdleConns: 32, // about as many as the goroutines that decide at once
	})
	store, err := redisstore.New(rdb, redisstore.Options{Batch: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := store.Warm(ctx); err != nil {
		// Not fatal: the store dials and loads on demand once Redis is up.
		log.Print(err)
	}
}

// A client for a store: ClientOptions keeps go-redis dialling while Redis
// restarts, so decisions come back within about 100 ms of Redis, and
// bounds each command by the call's deadline.
func ExampleClientOptions() {
	opts, err := redis.ParseURL("redis://127.0.0.1:6379/0")
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(redisstore.ClientOptions(opts))
	defer rdb.Close()
	fmt.Println(rdb.Options().ContextTimeoutEnabled, rdb.Options().DialTimeout)
	// Output: true 1m0s
}

func ExampleSlot() {
	fmt.Println(redisstore.Slot("fleetrate:{booking_com}/availability") == redisstore.Slot("fleetrate:{booking_com}"))
	// Output: true
}

// Behind Sentinels, a fleet that must not go over its limits through a
// failover lets each store empty its buckets on the new master: the
// grants the old master made after the replica's last copy are then not
// granted a second time (docs/OPERATIONS.md, Sentinel).
func ExampleOptions_emptyAfterFailover() {
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            "mymaster",
		SentinelAddrs:         []string{"127.0.0.1:26379", "127.0.0.1:26380", "127.0.0.1:26381"},
		ContextTimeoutEnabled: true,
	})
	defer rdb.Close()
	store, err := redisstore.New(rdb, redisstore.Options{EmptyAfterFailover: true})
	if err != nil {
		log.Fatal(err)
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(200, 40)}})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := lim.Wait(context.Background(), "partner-api"); err != nil {
		log.Print(err) // wraps fleetrate.ErrStoreUnavailable when Redis fails
	}
}
