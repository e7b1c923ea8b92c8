package redisstore_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// benchStore returns a store on a redis-server of its own for one caller,
// as a process of a fleet would make it (batching, the failover guard of a
// *redis.Client), with its scripts loaded.
func benchStore(b *testing.B) (*redisstore.Store, string) {
	srv := redistest.Start(b)
	c := redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: srv.Addr()}))
	b.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Warm(b.Context()); err != nil {
		b.Fatal(err)
	}
	return s, srv.Addr()
}

// scriptStats returns the script calls the server at addr has served and
// the µs it spent in them, from INFO commandstats: what Redis saw.
func scriptStats(b *testing.B, addr string) (calls, usec int64) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(b.Context(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			continue
		}
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += n
			case "usec":
				usec += n
			}
		}
	}
	return calls, usec
}

// measure runs op b.N times and reports the script calls per request the
// server served and the µs it spent in them (the server's own cost, which
// a loaded machine's scheduling disturbs less than ns/op).
func measure(b *testing.B, addr string, op func() error) {
	calls, usec := scriptStats(b, addr)
	b.ReportAllocs()
	for b.Loop() {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	calls2, usec2 := scriptStats(b, addr)
	b.ReportMetric(float64(calls2-calls)/float64(b.N), "calls/req")
	b.ReportMetric(float64(usec2-usec)/float64(b.N), "redis-µs/req")
}

// BenchmarkTake is one caller's plain take of a token, for comparison
// with BenchmarkPermit in the same run:
// go test -run '^$' -bench 'BenchmarkTake$|BenchmarkPermit$' -count 5 ./redisstore
func BenchmarkTake(b *testing.B) {
	s, addr := benchStore(b)
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "bench/take", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}}}, N: 1}
	measure(b, addr, func() error {
		if res, err := s.Take(b.Context(), req); err != nil || !res.Allowed {
			return fmt.Errorf("take: %+v, %w", res, err)
		}
		return nil
	})
}

// BenchmarkPermit is one caller's request bounded in flight: a take of a
// token with a permit, then its release, on a bucket whose bound and rate
// never bind (see BenchmarkTake).
func BenchmarkPermit(b *testing.B) {
	s, addr := benchStore(b)
	bk := []fleetrate.Bucket{{Key: "bench/permit", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}, InFlight: 100}}
	req := fleetrate.Request{Buckets: bk, N: 1, Permit: fleetrate.Permit{ID: "bench-holder", TTL: time.Minute}}
	measure(b, addr, func() error {
		if res, err := s.Take(b.Context(), req); err != nil || !res.Allowed {
			return fmt.Errorf("acquire: %+v, %w", res, err)
		}
		if held, err := s.Release(b.Context(), bk, req.Permit.ID); err != nil || held != 1 {
			return fmt.Errorf("release: %d, %w", held, err)
		}
		return nil
	})
}
