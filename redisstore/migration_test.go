package redisstore_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

var (
	migrationKeys    = flag.Int("migration.keys", 10_000, "TestMultiBucketTakeDuringMigration: other keys in the migrating slot (the issue's case is 100000)")
	migrationTimeout = flag.Duration("migration.timeout", time.Second, "TestMultiBucketTakeDuringMigration: the store's Timeout (1 s suits -race on a loaded machine; the default is 50 ms)")
)

// TestMultiBucketTakeDuringMigration migrates the slot of {ota}, holding
// -migration.keys other keys, from one master of a 3-master Cluster to
// another while 16 goroutines take one token at a time from two of its
// buckets at once (Allow): an endpoint's, {ota}/content/<n>, new at each
// take and so absent like any full bucket, and the credential's, {ota}.
// Redis answers TRYAGAIN to a multi-key script during the migration
// whenever a key is absent; the store then takes bucket by bucket. No take
// may fail, and the credential may not grant more than its burst plus its
// rate over the run.
func TestMultiBucketTakeDuringMigration(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Cluster")
	}
	cl := redistest.StartCluster(t, 3, 0)
	ctx := context.Background()
	content := fleetrate.Bucket{Key: "{ota}/content", Limits: []fleetrate.Limit{fleetrate.PerSecond(200, 20)}}
	var endpoint atomic.Int64
	ota := fleetrate.Bucket{Key: "{ota}", Limits: []fleetrate.Limit{fleetrate.PerSecond(300, 30)}}
	slot, err := cl.KeySlot(ota.StoreKey())
	if err != nil {
		t.Fatal(err)
	}
	from, err := cl.SlotOwner(slot)
	if err != nil {
		t.Fatal(err)
	}
	var to *redistest.Node
	for _, m := range cl.Masters() {
		if m != from {
			to = m
			break
		}
	}
	fill := redis.NewClient(&redis.Options{Addr: from.Addr()})
	defer fill.Close()
	for i := 0; i < *migrationKeys; i += 1000 {
		p := fill.Pipeline()
		for j := i; j < min(i+1000, *migrationKeys); j++ {
			p.Set(ctx, fmt.Sprintf("{ota}:other:%d", j), "x", 0)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c := redis.NewClusterClient(redisstore.ClusterClientOptions(&redis.ClusterOptions{Addrs: cl.Addrs()}))
	defer c.Close()
	// A timeout suited to -race on a loaded machine.
	s, err := redisstore.New(c, redisstore.Options{Timeout: *migrationTimeout})
	if err != nil {
		t.Fatal(err)
	}
	var (
		granted  atomic.Int64
		takes    atomic.Int64
		errCount atomic.Int64
		firstErr atomic.Value
		stop     = make(chan struct{})
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ep := content
				ep.Key = fmt.Sprintf("%s/%d", content.Key, endpoint.Add(1))
				res, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{ep, ota}, N: 1})
				takes.Add(1)
				if err != nil {
					errCount.Add(1)
					firstErr.CompareAndSwap(nil, err)
				} else if res.Allowed {
					granted.Add(1)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	migStart := time.Now()
	err = cl.MigrateSlot(slot, to, 0)
	migTook := time.Since(migStart)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if n := errCount.Load(); n > 0 {
		t.Errorf("%d of %d takes failed during the migration; first: %v", n, takes.Load(), firstErr.Load())
	}
	l := ota.Limits[0]
	bound := l.Burst + int64(l.Rate*elapsed.Seconds()) + 1
	if got := granted.Load(); got > bound {
		t.Errorf("%s granted %d over %v, more than its burst plus rate × time, %d", ota.Key, got, elapsed, bound)
	}
	t.Logf("slot %d with %d other keys migrated in %v; %d takes of both buckets over %v, %d granted, %d errors",
		slot, *migrationKeys, migTook.Round(time.Millisecond), takes.Load(), elapsed.Round(time.Millisecond), granted.Load(), errCount.Load())
}
