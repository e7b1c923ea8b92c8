package redisstore_test

import (
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

// reportCalls reports the script calls per request that the server at
// addr served since before (INFO commandstats: what Redis saw).
func reportCalls(b *testing.B, addr string, before int64) {
	after, err := redistest.ScriptCalls(addr)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(after-before)/float64(b.N), "calls/req")
}

// BenchmarkTake is one caller's plain take of a token, for comparison
// with BenchmarkPermit in the same run:
// go test -run '^$' -bench 'BenchmarkTake$|BenchmarkPermit$' -count 5 ./redisstore
func BenchmarkTake(b *testing.B) {
	s, addr := benchStore(b)
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: "bench/take", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}}}, N: 1}
	before, err := redistest.ScriptCalls(addr)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if res, err := s.Take(b.Context(), req); err != nil || !res.Allowed {
			b.Fatal(res, err)
		}
	}
	reportCalls(b, addr, before)
}

// BenchmarkPermit is one caller's request bounded in flight: a take of a
// token with a permit, then its release, on a bucket whose bound and rate
// never bind (see BenchmarkTake).
func BenchmarkPermit(b *testing.B) {
	s, addr := benchStore(b)
	bk := []fleetrate.Bucket{{Key: "bench/permit", Limits: []fleetrate.Limit{fleetrate.PerSecond(1e9, 1e9)}, InFlight: 100}}
	req := fleetrate.Request{Buckets: bk, N: 1, Permit: fleetrate.Permit{ID: "bench-holder", TTL: time.Minute}}
	before, err := redistest.ScriptCalls(addr)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if res, err := s.Take(b.Context(), req); err != nil || !res.Allowed {
			b.Fatal(res, err)
		}
		if held, err := s.Release(b.Context(), bk, req.Permit.ID); err != nil || held != 1 {
			b.Fatal(held, err)
		}
	}
	reportCalls(b, addr, before)
}
