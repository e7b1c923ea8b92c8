// Package benchmarks measures fleetrate side by side with its peers in one
// run. It is a module of its own so that the peers never become
// dependencies of the library.
//
//	cd benchmarks && go test -bench . -count 6 | tee new.txt && benchstat new.txt
package benchmarks

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/benchmarks/workload"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
)

func newMemLimiter(b *testing.B) *fleetrate.Limiter {
	l, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{
		Limits: []fleetrate.Limit{workload.Limit},
	})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkMemAllow is one goroutine on one key.
func BenchmarkMemAllow(b *testing.B) {
	ctx := context.Background()
	b.Run("fleetrate", func(b *testing.B) {
		l := newMemLimiter(b)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Allow(ctx, "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("x-time-rate", func(b *testing.B) {
		l := rate.NewLimiter(workload.Rate, workload.Burst)
		b.ReportAllocs()
		for b.Loop() {
			l.Allow()
		}
	})
}

// xMap is the usual way to key x/time/rate limiters: a map under a mutex.
type xMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (x *xMap) allow(key string) bool {
	x.mu.Lock()
	l, ok := x.m[key]
	if !ok {
		l = rate.NewLimiter(workload.Rate, workload.Burst)
		x.m[key] = l
	}
	x.mu.Unlock()
	return l.Allow()
}

// BenchmarkMemAllowParallel spreads all goroutines over 10,000 keys.
func BenchmarkMemAllowParallel(b *testing.B) {
	ctx := context.Background()
	b.Run("fleetrate", func(b *testing.B) {
		l := newMemLimiter(b)
		var seq atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(7919))
			for pb.Next() {
				i++
				if _, err := l.Allow(ctx, workload.KeyNames[i%workload.Keys]); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("x-time-rate", func(b *testing.B) {
		x := &xMap{m: map[string]*rate.Limiter{}}
		var seq atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(7919))
			for pb.Next() {
				i++
				x.allow(workload.KeyNames[i%workload.Keys])
			}
		})
	})
}

// redisSrv is one redis-server shared by every Redis benchmark.
var redisSrv *redistest.Server

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fleetrate-bench-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	redisSrv, err = redistest.Launch(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
	code := m.Run()
	redisSrv.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

func redisClient(srv *redistest.Server, pool int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: srv.Addr(), PoolSize: pool, ContextTimeoutEnabled: true})
}

// redisLimiter returns a Limiter at the benchmark's limit over a Redis
// store on c with opts (and a second's timeout), its scripts loaded.
func redisLimiter(b *testing.B, c *redis.Client, opts redisstore.Options) *fleetrate.Limiter {
	b.Helper()
	opts.Timeout = time.Second
	s, err := redisstore.New(c, opts)
	if err != nil {
		b.Fatal(err)
	}
	_ = s.LoadScripts(context.Background())
	l, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{workload.Limit}})
	if err != nil {
		b.Fatal(err)
	}
	return l
}

// BenchmarkRedisAllow compares one Allow on Redis over 10,000 keys at 1
// and 64 goroutines: fleetrate by default (batched), fleetrate with one
// call per take (Unbatched), and redis_rate.
func BenchmarkRedisAllow(b *testing.B) {
	srv := redisSrv
	ctx := context.Background()
	for _, g := range []int{1, 64} {
		for _, unbatched := range []bool{false, true} {
			name := "fleetrate/g="
			if unbatched {
				name = "fleetrate-unbatched/g="
			}
			b.Run(name+strconv.Itoa(g), func(b *testing.B) {
				c := redisClient(srv, g+4)
				defer c.Close()
				l := redisLimiter(b, c, redisstore.Options{Unbatched: unbatched})
				runParallel(b, g, func(i int) error {
					_, err := l.Allow(ctx, workload.KeyNames[i%workload.Keys])
					return err
				})
			})
		}
		b.Run("redis_rate/g="+strconv.Itoa(g), func(b *testing.B) {
			c := redisClient(srv, g+4)
			defer c.Close()
			l := redis_rate.NewLimiter(c)
			lim := redis_rate.Limit{Rate: workload.Rate, Burst: workload.Burst, Period: time.Second}
			runParallel(b, g, func(i int) error {
				_, err := l.Allow(ctx, workload.KeyNames[i%workload.Keys], lim)
				return err
			})
		})
	}
}

// runParallel runs f from g goroutines until b.N calls are done and reports
// decisions per second.
func runParallel(b *testing.B, g int, f func(i int) error) {
	b.ReportAllocs()
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range g {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := f(int(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
}

// BenchmarkRedisAllowHotFolded is 64 goroutines on one hot key with
// FoldHotKeys.
func BenchmarkRedisAllowHotFolded(b *testing.B) {
	ctx := context.Background()
	c := redisClient(redisSrv, 68)
	defer c.Close()
	l := redisLimiter(b, c, redisstore.Options{FoldHotKeys: true})
	runParallel(b, 64, func(int) error {
		_, err := l.Allow(ctx, "hot")
		return err
	})
}
