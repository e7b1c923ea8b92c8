package main

import (
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
	"github.com/fleetrate/fleetrate/internal/server"
)

// TestServeConcurrencyLimitAdapts runs serve on its load defaults
// (--max-in-flight and --latency-target 10 ms) while Redis answers late: it is
// paused (CLIENT PAUSE) 30 ms in every 40, so that a decision takes
// longer than the 10 ms target however fast the machine, and 32 callers
// keep asking. The concurrency limit falls below the cap and the calls
// beyond it are answered RESOURCE_EXHAUSTED within the measured noise
// allowance, never queued; every answer is a decision or a shed. Once
// Redis answers at once again, the limit climbs back until 4 callers are
// no longer shed, and the goroutines return to where they were.
func TestServeConcurrencyLimitAdapts(t *testing.T) {
	rs := redistest.Start(t)
	path := serveWriteFile(t, "fleetrate.yaml", safetyConfig)
	httpAddr, grpcAddr, _, stop := startServe(t, "--config", path, "--redis", rs.URL(), "--latency-target", server.DefaultLatencyTarget.String())
	defer stop()
	metrics := "http://" + httpAddr + "/metrics"
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	if got := metricValue(t, metrics, "fleetrate_concurrency_limit"); got != float64(server.DefaultMaxInFlight()) {
		t.Fatalf("limit at start: %v, want the cap %d", got, server.DefaultMaxInFlight())
	}
	before := runtime.NumGoroutine()

	noise := schednoise.Start()
	slowing := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { slowRedis(t, rs, slowing) })
	done := make(chan struct{})
	wait := rlsLoad(rls, 32, done)
	time.Sleep(2 * time.Second)
	limit := metricValue(t, metrics, "fleetrate_concurrency_limit")
	close(done)
	calls := wait()
	close(slowing)
	wg.Wait()
	worst := noise.Stop()

	var decided, shed int
	var slowestShed time.Duration
	for _, c := range calls {
		switch c.code {
		case codes.OK:
			decided++
		case codes.ResourceExhausted:
			shed++
			slowestShed = max(slowestShed, c.took)
		default:
			t.Fatalf("with Redis late: %v, want OK or ResourceExhausted", c.code)
		}
	}
	allow := schednoise.Allowance(worst, 50*time.Millisecond)
	t.Logf("Redis late, 32 callers, 2 s: limit %v, %d decided, %d shed, slowest shed %v (noise %v)", limit, decided, shed, slowestShed, worst)
	if limit >= float64(server.DefaultMaxInFlight()) || limit >= 32 {
		t.Errorf("concurrency limit with every decision late: %v, want below the 32 callers", limit)
	}
	if decided == 0 || shed == 0 {
		t.Errorf("%d decided, %d shed; want both", decided, shed)
	}
	if slowestShed > allow {
		t.Errorf("a shed call took %v, want within the noise allowance %v", slowestShed, allow)
	}
	if got := metricValue(t, metrics, `fleetrate_shed_total{api="grpc"}`); got != float64(shed) {
		t.Errorf("fleetrate_shed_total{api=\"grpc\"} %v, want the %d the callers saw", got, shed)
	}

	// Redis answers at once again: the limit climbs back until 4 callers
	// are all decided.
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := make(chan struct{})
		wait := rlsLoad(rls, 4, done)
		time.Sleep(500 * time.Millisecond)
		close(done)
		shed := 0
		for _, c := range wait() {
			if c.code != codes.OK {
				shed++
			}
		}
		if shed == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("4 callers still shed 30 s after Redis recovered (limit %v)", metricValue(t, metrics, "fleetrate_concurrency_limit"))
		}
	}
	t.Logf("limit after recovery under 4 callers: %v", metricValue(t, metrics, "fleetrate_concurrency_limit"))
	settle := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+8 && time.Now().Before(settle) {
		time.Sleep(10 * time.Millisecond) // the callers' goroutines end
	}
	if n := runtime.NumGoroutine(); n > before+8 {
		t.Errorf("%d goroutines after the overload, %d before", n, before)
	}
}

// slowRedis pauses rs's clients for 30 ms in every 40 until stop closes.
func slowRedis(t *testing.T, rs *redistest.Server, stop <-chan struct{}) {
	tick := time.NewTicker(40 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := rs.Do("client", "pause", strconv.Itoa(30), "all"); err != nil {
			t.Errorf("CLIENT PAUSE: %v", err)
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}
