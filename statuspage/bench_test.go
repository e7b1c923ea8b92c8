package statuspage

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// BenchmarkDecisions measures Limiter.Allow over the in-memory store, in
// parallel, bare (no Counter), counted (the store wrapped by a Counter,
// nobody watching) and with the page open (counted, and the page
// refreshed every 100 ms, ten times its default rate, by another
// goroutine). Granted takes draw from one of 64 buckets the page shows;
// denied takes from buckets drained for an hour, so every one is a denial
// (the path that also remembers the key). docs/BENCHMARKS.md quotes it.
func BenchmarkDecisions(b *testing.B) {
	for _, outcome := range []string{"granted", "denied"} {
		for _, mode := range []string{"bare", "counted", "page-open"} {
			b.Run(outcome+"/"+mode, func(b *testing.B) { benchDecisions(b, outcome == "denied", mode) })
		}
	}
}

func benchDecisions(b *testing.B, denied bool, mode string) {
	const nbuckets = 64
	ctx := context.Background()
	var store fleetrate.Store = memstore.New(memstore.Options{})
	c := NewCounter()
	if mode != "bare" {
		store = c.Wrap(store)
	}
	limit := fleetrate.PerSecond(1e9, 1<<40)
	if denied {
		limit = fleetrate.PerSecond(1, 1)
	}
	cfg := fleetrate.Config{}
	names := make([]string, nbuckets)
	for i := range names {
		names[i] = "bucket-" + strconv.Itoa(i)
		cfg.Buckets = append(cfg.Buckets, fleetrate.BucketConfig{Name: names[i], Limits: []fleetrate.Limit{limit}})
	}
	lim, err := fleetrate.New(store, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if denied {
		if err := lim.Drain(ctx, time.Hour, names...); err != nil {
			b.Fatal(err)
		}
	}
	if mode == "page-open" {
		page, err := New(Options{Store: store, Buckets: LimiterBuckets(lim, names...), Counter: c, Interval: 100 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				page.Status(ctx)
				select {
				case <-stop:
					return
				case <-t.C:
				}
			}
		}()
		b.Cleanup(func() { close(stop); <-done })
	}
	var worker atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := int(worker.Add(1)) * 7
		for pb.Next() {
			res, err := lim.Allow(ctx, names[i%nbuckets])
			if err != nil || res.Allowed == denied {
				b.Errorf("Allow = %+v, %v; want allowed %v", res, err, !denied)
				return
			}
			i++
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}
