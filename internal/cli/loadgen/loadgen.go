// Package loadgen drives load at a limiter and measures it: the closed
// loop of concurrent callers that both `fleetrate bench` and the
// benchmarks module's fleetbench use, and the pipelined ceiling of the
// Redis store's take script, the most takes a second that one Redis
// deployment runs when nothing but the script costs anything.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/redisstore"
)

// Measurement is what Measure saw.
type Measurement struct {
	// Ops is successful calls per second: a failed call decided nothing,
	// so it is counted in Errors only.
	Ops float64
	// Calls and Errors count the calls made and those that failed.
	Calls, Errors int64
	// P50 and P99 are latency percentiles of every call.
	P50, P99 time.Duration
	// FirstErr is the first failure, nil if none.
	FirstErr error
}

// Measure calls f from g goroutines, each again as soon as its previous
// call returns, for d or until ctx ends, and reports throughput and
// latency. i numbers the calls from 1 across goroutines, so that f can
// spread them over keys.
func Measure(ctx context.Context, g int, d time.Duration, f func(ctx context.Context, i int) error) Measurement {
	var (
		next     atomic.Int64
		errs     atomic.Int64
		firstErr error
		mu       sync.Mutex
		lat      []time.Duration
		wg       sync.WaitGroup
		finish   = time.Now().Add(d)
	)
	start := time.Now()
	for range g {
		wg.Go(func() {
			local := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil && time.Now().Before(finish) {
				i := int(next.Add(1))
				t0 := time.Now()
				err := f(ctx, i)
				local = append(local, time.Since(t0))
				if err != nil && errs.Add(1) == 1 {
					mu.Lock()
					firstErr = err
					mu.Unlock()
				}
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(start)
	slices.Sort(lat)
	m := Measurement{Calls: int64(len(lat)), Errors: errs.Load(), FirstErr: firstErr}
	m.Ops = float64(m.Calls-m.Errors) / el.Seconds()
	if len(lat) > 0 {
		m.P50, m.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return m
}

// Client is the part of a go-redis client Ceiling uses; every go-redis
// client type satisfies it.
type Client interface {
	redisstore.Client
	Pipeline() redis.Pipeliner
}

// Default shape of the ceiling's load, that of redis-benchmark -c 50 -P 32.
const (
	CeilingClients = 50
	CeilingDepth   = 32
)

// Ceiling runs the Redis store's take script (one take of one token now,
// from a bucket with limits) by EVALSHA from clients goroutines, each
// sending pipelines of depth calls, for d or until ctx ends, and returns
// the takes run per second. key(i) names the i-th take's key; the caller
// owns those keys and deletes them. It loads the script first. Any failed
// call is an error: a ceiling that mixed in failures would not be one.
func Ceiling(ctx context.Context, c Client, d time.Duration, clients, depth int, limits []fleetrate.Limit, key func(i int) string) (float64, error) {
	if clients < 1 || depth < 1 {
		return 0, fmt.Errorf("loadgen: clients and depth must be at least 1, got %d and %d", clients, depth)
	}
	// The bare take script, which KeepAfterFailover loads (the default
	// failover guard would load its guarded twin instead).
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, KeepAfterFailover: true})
	if err != nil {
		return 0, err
	}
	if err := s.LoadScripts(ctx); err != nil {
		return 0, err
	}
	sha, args := redisstore.TakeScriptSHA(), redisstore.TakeScriptArgs(1, limits)
	var (
		next  atomic.Int64
		done  atomic.Int64
		first atomic.Pointer[error]
		wg    sync.WaitGroup
	)
	finish := time.Now().Add(d)
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(finish) && first.Load() == nil {
				p := c.Pipeline()
				for range depth {
					p.EvalSha(ctx, sha, []string{key(int(next.Add(1)))}, args...)
				}
				if _, err := p.Exec(ctx); err != nil {
					first.CompareAndSwap(nil, &err)
					return
				}
				done.Add(int64(depth))
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	if e := first.Load(); e != nil && !errors.Is(*e, context.Canceled) {
		return 0, fmt.Errorf("loadgen: ceiling: %w", *e)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return float64(done.Load()) / el.Seconds(), nil
}
