package main

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/memstore"
)

func TestEnvoyEnvPerSecond(t *testing.T) {
	t.Parallel()
	env := map[string]string{"USE_STATSD": "false", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "main:6379",
		"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": "persec:6379",
		"REDIS_PERSECOND_AUTH": "pw", "REDIS_PERSECOND_POOL_SIZE": "7", "REDIS_PERSECOND_TIMEOUT": "1s"}
	got, notes, err := envoyEnv(envFrom(env))
	if err != nil {
		t.Fatal(err)
	}
	if got["redis"] != "redis://main:6379" || got["redis-per-second"] != "redis://:pw@persec:6379?pool_size=7" {
		t.Errorf("redis %q, per-second %q", got["redis"], got["redis-per-second"])
	}
	if len(notes) != 1 || !strings.HasPrefix(notes[0], "REDIS_PERSECOND_TIMEOUT: ignored") {
		t.Errorf("notes %q", notes)
	}
	env["REDIS_PERSECOND_POOL_SIZE"] = "many"
	if _, _, err := envoyEnv(envFrom(env)); err == nil || !strings.Contains(err.Error(), "REDIS_PERSECOND_POOL_SIZE") {
		t.Errorf("bad pool size: %v, want an error naming REDIS_PERSECOND_POOL_SIZE", err)
	}
	delete(env, "REDIS_URL")
	env["REDIS_PERSECOND_POOL_SIZE"] = "7"
	env["FLEETRATE_CONFIG"] = serveWriteFile(t, "f.yaml", "domain: d\n")
	env["FLEETRATE_REDIS"] = ""
	cmd := serveCommand(envFrom(env))
	if err := cmd.ParseFlags(nil); err != nil {
		t.Fatal(err)
	}
	env["REDIS_SOCKET_TYPE"] = ""
	if _, err := resolveSettings(cmd.Flags(), envFrom(env)); err == nil || !strings.Contains(err.Error(), "--redis-per-second (REDIS_PERSECOND) needs --redis") {
		t.Errorf("per-second store without a store: %v", err)
	}
}

func TestPerSecondStoreRoutes(t *testing.T) {
	t.Parallel()
	main, second := memstore.New(memstore.Options{}), memstore.New(memstore.Options{})
	p := perSecondStore{main: main, second: second}
	ctx := context.Background()
	sec := fleetrate.Bucket{Key: "s", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 10)}}
	minute := fleetrate.Bucket{Key: "m", Limits: []fleetrate.Limit{fleetrate.PerPeriod(10, time.Minute)}}
	for _, b := range []fleetrate.Bucket{sec, minute} {
		if res, err := p.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 10}); err != nil || !res.Allowed {
			t.Fatalf("%s: %+v, %v", b.Key, res, err)
		}
	}
	// Each bucket is empty in its own store only.
	for _, c := range []struct {
		s    fleetrate.Store
		b    fleetrate.Bucket
		left int64
	}{{second, sec, 0}, {main, sec, 10}, {main, minute, 0}, {second, minute, 10}} {
		res, err := c.s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{c.b}, N: 0})
		if err != nil || res.Remaining != c.left {
			t.Errorf("bucket %s: %d left, %v; want %d", c.b.Key, res.Remaining, err, c.left)
		}
	}
	if _, err := p.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{sec, minute}, N: 1}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("mixed take: %v, want ErrInvalid", err)
	}
	if err := p.Drain(ctx, []fleetrate.Bucket{minute, sec}, time.Second); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("mixed drain: %v, want ErrInvalid", err)
	}
	if err := p.Reset(ctx, "s", "m"); err != nil {
		t.Fatal(err)
	}
	if res, _ := p.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{sec}, N: 0}); res.Remaining != 10 {
		t.Errorf("after reset: %d left, want 10", res.Remaining)
	}
}

// TestServePerSecondRedis runs serve as an envoyproxy/ratelimit deployment
// with REDIS_PERSECOND: the per-second rule's keys are in the second
// Redis, the per-minute rule's in the first, and /readyz asks both.
func TestServePerSecondRedis(t *testing.T) {
	t.Parallel()
	mainRedis, perSec := redistest.Start(t), redistest.Start(t)
	path := serveWriteFile(t, "fleetrate.yaml", "domain: edge\ndescriptors:\n  - key: fast\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: slow\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	env := map[string]string{"USE_STATSD": "false", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": mainRedis.Addr(),
		"REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_URL": perSec.Addr()}
	h, g, _, _ := startServeEnv(t, envFrom(env), "--config", path)
	conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	for _, key := range []string{"fast", "slow"} {
		req := &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: "x"}}}}}
		if resp, err := rls.ShouldRateLimit(context.Background(), req); err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("%s: %v, %v", key, resp, err)
		}
	}
	keys := func(s *redistest.Server) []string {
		ks, err := s.Client().Keys(context.Background(), "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		ks = slices.DeleteFunc(ks, func(k string) bool { return strings.HasSuffix(k, "_readyz") })
		slices.Sort(ks)
		return ks
	}
	if got := keys(mainRedis); len(got) != 1 || !strings.Contains(got[0], "slow") {
		t.Errorf("main Redis keys %q, want the per-minute rule's only", got)
	}
	if got := keys(perSec); len(got) != 1 || !strings.Contains(got[0], "fast") {
		t.Errorf("per-second Redis keys %q, want the per-second rule's only", got)
	}
	status := func() int {
		var m map[string]string
		return getJSON(t, "http://"+h+"/readyz", &m)
	}
	if code := status(); code != 200 {
		t.Fatalf("/readyz %d with both up", code)
	}
	perSec.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for status() != 503 {
		if time.Now().After(deadline) {
			t.Fatal("/readyz still 200 10 s after the per-second Redis was killed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
