package redisstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// BenchmarkEmptyAfterFailover measures what the failover guard costs a
// take, against the same store without it in the same run: one caller
// (each take its own script call), and 64 goroutines (batched, the
// default). go test -run '^$' -bench EmptyAfterFailover -count 5 ./redisstore
func BenchmarkEmptyAfterFailover(b *testing.B) {
	srv := redistest.Start(b)
	lim := []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}
	for _, parallel := range []bool{false, true} {
		for _, guard := range []bool{false, true} {
			b.Run(fmt.Sprintf("parallel=%v/EmptyAfterFailover=%v", parallel, guard), func(b *testing.B) {
				c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: srv.Addr(), PoolSize: 64}))
				b.Cleanup(func() { _ = c.Close() })
				s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, EmptyAfterFailover: guard})
				if err != nil {
					b.Fatal(err)
				}
				var next atomic.Int64
				req := func() fleetrate.Request {
					return fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: fmt.Sprint("bench", next.Add(1)%64), Limits: lim}}, N: 1}
				}
				b.ReportAllocs()
				if !parallel {
					for b.Loop() {
						if _, err := s.Take(b.Context(), req()); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(32) // 64 goroutines on 2 cores
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := s.Take(b.Context(), req()); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
