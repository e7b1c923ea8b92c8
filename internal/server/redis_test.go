package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// TestTwoInstancesShareOneRedisBudget runs two service instances, each
// with its own Redis connection, over one real redis-server, and sends
// them concurrent requests: together they admit exactly one budget.
func TestTwoInstancesShareOneRedisBudget(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	const src = `
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 50}
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: hour, requests_per_unit: 40}
`
	var instances []*testServer
	for i := 0; i < 2; i++ {
		client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
		t.Cleanup(func() { client.Close() })
		store, err := redisstore.New(client, redisstore.Options{Timeout: -1})
		if err != nil {
			t.Fatal(err)
		}
		instances = append(instances, start(t, src, func(o *Options) {
			o.Store, o.StoreName = store, rs.URL()
			// 200 concurrent requests under -race on a loaded machine can
			// queue past the 1 s default: every answer must be a decision.
			o.StoreTimeout = 30 * time.Second
		}))
	}
	for _, ts := range instances {
		if code, body := ts.get(t, "/readyz"); code != http.StatusOK {
			t.Fatalf("/readyz over Redis: %d %s", code, body)
		}
	}

	var rlsOK, takeOK atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := 0; i < 100; i++ {
		ts := instances[i%2]
		wg.Go(func() {
			resp, err := ts.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{
				Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "acme")}})
			if err != nil {
				errs <- err
				return
			}
			if resp.OverallCode == rlspb.RateLimitResponse_OK {
				rlsOK.Add(1)
			}
		})
		wg.Go(func() {
			resp, err := http.Post(ts.url+"/v1/take", "application/json", strings.NewReader(`{"bucket":"booking_com/availability"}`))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			var d Decision
			if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || resp.StatusCode != http.StatusOK {
				errs <- fmt.Errorf("take: status %d, %v", resp.StatusCode, err)
				return
			}
			if d.Allowed {
				takeOK.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := rlsOK.Load(); got != 50 {
		t.Errorf("RLS: %d of 100 allowed across two instances, want exactly the budget of 50", got)
	}
	if got := takeOK.Load(); got != 40 {
		t.Errorf("/v1/take: %d of 100 allowed across two instances, want exactly the budget of 40", got)
	}
	// Both instances see the same bucket.
	for i, ts := range instances {
		var d Decision
		ts.post(t, "/v1/take", `{"bucket":"booking_com/availability","n":0}`, &d)
		if d.Remaining != 0 {
			t.Errorf("instance %d sees %d left, want 0", i, d.Remaining)
		}
	}
}

// TestRedisDownIsUnavailable stops Redis under a running service: the
// service answers errors and fails /readyz, but stays alive.
func TestRedisDownIsUnavailable(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr(), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	store, err := redisstore.New(client, redisstore.Options{Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, rlsConfig, func(o *Options) { o.Store = store })
	if r := ts.should(t, "edge", 0, desc("remote_address", "r")); r.OverallCode != ok {
		t.Fatalf("with Redis up: %v", r.OverallCode)
	}
	rs.Stop()
	_, err = ts.rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{
		Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("remote_address", "r")}})
	if err == nil {
		t.Fatal("ShouldRateLimit with Redis down succeeded")
	}
	if code, _ := ts.get(t, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with Redis down: %d, want 503", code)
	}
	if code, _ := ts.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with Redis down: %d, want 200", code)
	}
}

// TestManyDescriptorsOneScriptCall sends calls of 32 descriptors to a
// service on a real Redis: Redis runs one script call for each call's
// 32 takes (INFO commandstats), not one per descriptor, and the answers
// are the buckets' own: the third call finds each bucket of 2 empty.
func TestManyDescriptorsOneScriptCall(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { client.Close() })
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, `
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2}
`, func(o *Options) { o.Store = store })
	var ds []*rlcommon.RateLimitDescriptor
	for i := range 32 {
		ds = append(ds, desc("tenant", fmt.Sprint("t", i)))
	}
	scripts := func() int64 {
		t.Helper()
		info, err := client.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(info, "\r\n") {
			for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
				if rest, ok := strings.CutPrefix(line, cmd); ok {
					var c int64
					fmt.Sscan(strings.SplitN(rest, ",", 2)[0], &c)
					n += c
				}
			}
		}
		return n
	}
	ts.should(t, "edge", 0, ds...) // loads the script
	for call, want := range []rlspb.RateLimitResponse_Code{ok, over} {
		before := scripts()
		r := ts.should(t, "edge", 0, ds...)
		if got := scripts() - before; got != 1 {
			t.Errorf("call %d of 32 descriptors: %d script calls, want 1", call+2, got)
		}
		if r.OverallCode != want {
			t.Errorf("call %d: %v, want %v", call+2, r.OverallCode, want)
		}
		for i, st := range r.Statuses {
			if st.Code != want || st.LimitRemaining != 0 {
				t.Errorf("call %d, descriptor %d: %v with %d remaining, want %v with 0", call+2, i, st.Code, st.LimitRemaining, want)
			}
		}
	}
}
