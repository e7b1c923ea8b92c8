package main

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
)

// TestServeHungRedisBoundsEveryDecision freezes Redis (SIGSTOP) under a
// running `fleetrate serve`, batched and not, while 32 clients ask it for
// decisions over HTTP (/v1/take) and gRPC (ShouldRateLimit): every answer
// is a failure (503, or gRPC Unavailable), never a denial, and comes
// within --store-timeout plus the scheduling noise measured in the same
// window: a decision crosses four wake-ups (the server reading the
// request, the store's timer, the handler writing the answer, the client
// reading it), each late by up to the noise, plus 100 ms for serving 32
// clients at once under -race (measured with a 100 ms store timeout: up to
// 20 ms beyond the timeout and twice the noise). The store timeout, 400
// ms, is longer than that allowance at the noise a loaded 2-core machine
// shows (65 ms at load 8), so that a decision that waited for the timeout
// twice still fails the test.
func TestServeHungRedisBoundsEveryDecision(t *testing.T) {
	const timeout = 400 * time.Millisecond
	rs := redistest.Start(t)
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	for _, batch := range []string{"true", "false"} {
		t.Run("redis-batch="+batch, func(t *testing.T) {
			httpAddr, grpcAddr, _, stop := startServe(t, "--config", path, "--redis", rs.URL(),
				"--store-timeout", timeout.String(), "--redis-batch="+batch)
			defer stop()
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			rls := rlspb.NewRateLimitServiceClient(conn)
			client := &http.Client{Timeout: 10 * time.Second}
			base := "http://" + httpAddr
			// Both paths work, connected and with their scripts loaded.
			for range 3 {
				if code, m := servePost(t, client, base+"/v1/take", `{"bucket":"booking_com/availability","n":0}`); code != http.StatusOK {
					t.Fatalf("/v1/take with Redis up: %d %v", code, m)
				}
				if _, err := rls.ShouldRateLimit(t.Context(), hungRLSRequest()); err != nil {
					t.Fatalf("ShouldRateLimit with Redis up: %v", err)
				}
			}
			rs.Pause()
			defer rs.Resume()
			watch := schednoise.Start()
			var (
				mu          sync.Mutex
				worst       [2]time.Duration // HTTP, gRPC
				calls       int
				wg          sync.WaitGroup
				end         = time.Now().Add(5 * timeout)
				httpOutcome = map[int]int{}
			)
			for i := range 32 {
				wg.Go(func() {
					for time.Now().Before(end) {
						start := time.Now()
						var kind int
						if i%2 == 0 {
							code, err := hungPost(client, base+"/v1/take", `{"bucket":"booking_com/availability","n":1}`)
							if err != nil || code != http.StatusServiceUnavailable {
								t.Errorf("/v1/take on a hung Redis: %d, %v; want 503", code, err)
								return
							}
							mu.Lock()
							httpOutcome[code]++
							mu.Unlock()
						} else {
							kind = 1
							_, err := rls.ShouldRateLimit(context.Background(), hungRLSRequest())
							if status.Code(err) != codes.Unavailable {
								t.Errorf("ShouldRateLimit on a hung Redis: %v; want Unavailable", err)
								return
							}
						}
						took := time.Since(start)
						mu.Lock()
						worst[kind] = max(worst[kind], took)
						calls++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			noise := watch.Stop()
			bound := timeout + 2*noise + schednoise.Allowance(noise, 100*time.Millisecond)
			t.Logf("%d decisions on a frozen Redis: slowest HTTP %v, gRPC %v, with a %v store timeout (scheduling noise %v, bound %v); HTTP answers %v",
				calls, worst[0], worst[1], timeout, noise, bound, httpOutcome)
			for kind, w := range worst {
				if w > bound {
					t.Errorf("%s: slowest decision on a hung Redis took %v, more than the %v store timeout plus %v of measured scheduling noise",
						[]string{"HTTP", "gRPC"}[kind], w, timeout, bound-timeout)
				}
			}
		})
	}
}

func hungRLSRequest() *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}
}

// hungPost posts body to url and returns the status code; it reports
// failures as errors, so it may run on any goroutine.
func hungPost(client *http.Client, url, body string) (int, error) {
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return resp.StatusCode, nil
}
