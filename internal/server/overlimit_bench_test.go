package server

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
)

// countingStore counts the takes that reach a store.
type countingStore struct {
	fleetrate.Store
	takes atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	c.takes.Add(1)
	return c.Store.Take(ctx, req)
}

// BenchmarkRLSHotOverLimit decides RLS requests from 64 clients that are
// all over their limit (10 an hour), from all cores, through the service's
// decision path (no network between Envoy and the service), over a real
// redis-server and over the memory store, without and with the over-limit
// cache (Options.LocalCacheBytes). It reports decisions per second and the
// store calls per decision:
//
//	go test -run '^$' -bench BenchmarkRLSHotOverLimit -count 3 ./internal/server
func BenchmarkRLSHotOverLimit(b *testing.B) {
	rs := redistest.Start(b)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	b.Cleanup(func() { client.Close() })
	cfg, err := config.Load("bench.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
`))
	if err != nil {
		b.Fatal(err)
	}
	const clients = 64
	reqs := make([]*rlspb.RateLimitRequest, clients)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("remote_address", "10.0.0."+strconv.Itoa(i))}}
	}
	for _, st := range []string{"redis", "memory"} {
		for _, cache := range []int64{0, 1 << 20} {
			name := st + "/cache=off"
			if cache > 0 {
				name = st + "/cache=on"
			}
			b.Run(name, func(b *testing.B) {
				var store fleetrate.Store = memstore.New(memstore.Options{})
				if st == "redis" {
					rst, err := redisstore.New(client, redisstore.Options{Timeout: 10 * time.Second, Batch: true})
					if err != nil {
						b.Fatal(err)
					}
					store = rst
				}
				counted := &countingStore{Store: store}
				s, err := New(Options{Store: counted, Config: cfg, LocalCacheBytes: cache, Prefix: "bench:" + name + ":",
					StoreTimeout: 10 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				if err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				for _, r := range reqs { // spend every client's 10
					for range 11 {
						if _, err := s.shouldRateLimit(ctx, r); err != nil {
							b.Fatal(err)
						}
					}
				}
				counted.takes.Store(0)
				var seq, over atomic.Int64
				b.ReportAllocs()
				b.ResetTimer()
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					i := int(seq.Add(17))
					for pb.Next() {
						i++
						resp, err := s.shouldRateLimit(ctx, reqs[i%clients])
						if err != nil {
							b.Error(err)
							return
						}
						if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
							over.Add(1)
						}
					}
				})
				el := time.Since(start)
				b.StopTimer()
				if over.Load() != int64(b.N) {
					b.Fatalf("%d of %d decisions over the limit, want all", over.Load(), b.N)
				}
				b.ReportMetric(float64(b.N)/el.Seconds(), "decisions/s")
				b.ReportMetric(float64(counted.takes.Load())/float64(b.N), "store-calls/decision")
			})
		}
	}
}
