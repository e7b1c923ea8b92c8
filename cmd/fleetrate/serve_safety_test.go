package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
)

// safetyConfig has one descriptor whose limit is never reached, so that
// every answer is OK unless the store fails (an emptied bucket refills in
// a microsecond).
const safetyConfig = `
domain: safe
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

// safetyCall is one RLS call's outcome.
type safetyCall struct {
	start time.Time
	took  time.Duration
	code  codes.Code
}

// rlsLoad runs callers goroutines asking rls for decisions until stop
// closes, and returns every call's outcome.
func rlsLoad(rls rlspb.RateLimitServiceClient, callers int, stop <-chan struct{}) func() []safetyCall {
	var mu sync.Mutex
	var calls []safetyCall
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			req := &rlspb.RateLimitRequest{Domain: "safe", Descriptors: []*rlcommon.RateLimitDescriptor{{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: strconv.Itoa(i)}}}}}
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				_, err := rls.ShouldRateLimit(ctx, req)
				took := time.Since(start)
				cancel()
				mu.Lock()
				calls = append(calls, safetyCall{start, took, status.Code(err)})
				mu.Unlock()
				if err != nil {
					time.Sleep(time.Millisecond) // a failing service answers at once
				}
			}
		})
	}
	return func() []safetyCall { wg.Wait(); return calls }
}

// metricValue reads one sample of the Prometheus text at url.
func metricValue(t *testing.T, url, sample string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("no %s in the metrics", sample)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// TestServeKilledRedisUnderLoadWithBreaker kills Redis under 8 callers
// and restarts it (without its data) on the service's breaker and policy
// defaults (fail_closed: UNAVAILABLE, for Envoy's failure_mode_deny to
// decide). During the outage every answer is UNAVAILABLE, never a
// denial, within the store timeout plus the measured scheduling noise;
// the breaker opens (/readyz and fleetrate_breaker_open say so), so that
// Redis sees about one probe per cool-off rather than every call; and
// decisions resume within the cool-off plus the noise allowance once
// Redis is back. The store timeout is 200 ms rather than the default
// 15 ms, which the race detector on a loaded machine can exceed on a
// healthy Redis.
func TestServeKilledRedisUnderLoadWithBreaker(t *testing.T) {
	const storeTimeout = 200 * time.Millisecond
	rs := redistest.Start(t)
	path := serveWriteFile(t, "fleetrate.yaml", safetyConfig)
	httpAddr, grpcAddr, _, stop := startServe(t, "--config", path, "--redis", rs.URL(), "--store-timeout", storeTimeout.String())
	defer stop()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	base := "http://" + httpAddr
	noise := schednoise.Start()
	done := make(chan struct{})
	wait := rlsLoad(rlspb.NewRateLimitServiceClient(conn), 8, done)
	time.Sleep(time.Second)
	failures0 := metricValue(t, base+"/metrics", `fleetrate_store_failures_total{store="redis"}`)
	rs.Kill() // returns once redis-server has exited
	killed := time.Now()
	time.Sleep(time.Second)
	var ready map[string]string
	code := getJSON(t, base+"/readyz", &ready)
	open := metricValue(t, base+"/metrics", `fleetrate_breaker_open{store="redis"}`)
	time.Sleep(500 * time.Millisecond)
	failures := metricValue(t, base+"/metrics", `fleetrate_store_failures_total{store="redis"}`) - failures0
	// The outage ends when the restart begins: a breaker probe may reach
	// the new redis-server before Restart has seen it ready.
	restarting := time.Now()
	rs.Restart()
	back := time.Now()
	time.Sleep(1500 * time.Millisecond)
	close(done)
	calls := wait()
	worst := noise.Stop()
	allow := schednoise.Allowance(worst, 100*time.Millisecond)

	if code != http.StatusServiceUnavailable || ready["breaker"] != "open" || open != 1 {
		t.Errorf("with Redis killed: /readyz %d %v, fleetrate_breaker_open %v; want 503, breaker open, 1", code, ready, open)
	}
	var during, slowest int
	var slow time.Duration
	firstOK := time.Time{}
	for _, c := range calls {
		switch {
		case c.start.After(killed) && c.start.Add(c.took).Before(restarting):
			during++
			// One OK in about 3,000 began within milliseconds of
			// redis-server's exit in 1 of 3 runs (not explained yet:
			// replies it wrote before it died are still read from
			// the socket); later ones must fail.
			if c.code != codes.Unavailable && (c.code != codes.OK || c.start.Sub(killed) > 50*time.Millisecond) {
				t.Errorf("call %v into the outage: %v, want Unavailable", c.start.Sub(killed), c.code)
			}
			if c.code == codes.OK {
				t.Logf("call %v into the outage answered OK", c.start.Sub(killed))
			}
			if c.took > slow {
				slow = c.took
			}
			if c.took > storeTimeout+allow {
				slowest++
			}
		case c.start.After(back) && c.code == codes.OK && firstOK.IsZero():
			firstOK = c.start.Add(c.took)
		}
	}
	t.Logf("%d calls during the outage, slowest %v; %v store failures in 1.5 s of it; first decision %v after the restart; noise %v",
		during, slow, failures, firstOK.Sub(back), worst)
	if slowest > 0 {
		t.Errorf("%d calls during the outage took over the store timeout plus the allowance (%v); slowest %v", slowest, storeTimeout+allow, slow)
	}
	// Without the breaker every call would reach Redis: the 8 callers
	// plus one per cool-off (a probe) and the threshold's own.
	if limit := float64(failsafe.DefaultFailureThreshold+8) + 1.5*float64(time.Second/failsafe.DefaultCoolOff)*2; failures > limit || float64(during) < 2*failures {
		t.Errorf("%v store failures for %d calls in the outage, want at most %v and under half the calls", failures, during, limit)
	}
	if firstOK.IsZero() || firstOK.Sub(back) > failsafe.DefaultCoolOff+schednoise.Allowance(worst, time.Second) {
		t.Errorf("first decision %v after the restart, want within the cool-off plus %v", firstOK.Sub(back), schednoise.Allowance(worst, time.Second))
	}
}

func getJSON(t *testing.T, url string, out any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: %d: %v", url, resp.StatusCode, err)
	}
	return resp.StatusCode
}

// TestServeOverloadSheds holds --max-in-flight decisions in a frozen
// Redis (SIGSTOP): the calls beyond are answered RESOURCE_EXHAUSTED
// within the noise allowance, without piling up goroutines; once Redis
// resumes, the held ones are decided. Then 16 times the bound in callers
// load the service for a second: every answer is a decision or
// RESOURCE_EXHAUSTED, and the goroutines return to where they were.
func TestServeOverloadSheds(t *testing.T) {
	const bound = 4
	rs := redistest.Start(t)
	path := serveWriteFile(t, "fleetrate.yaml", safetyConfig)
	_, grpcAddr, _, stop := startServe(t, "--config", path, "--redis", rs.URL(), "--store-timeout", "5s", "--max-in-flight", strconv.Itoa(bound))
	defer stop()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{Domain: "safe", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "held"}}}}}
	if _, err := rls.ShouldRateLimit(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	noise := schednoise.Start()
	rs.Pause()
	held := make(chan error, bound)
	for range bound {
		go func() { _, err := rls.ShouldRateLimit(context.Background(), req); held <- err }()
	}
	// The held calls reach the service (and its frozen store) first.
	time.Sleep(200 * time.Millisecond)
	var slow time.Duration
	for range 100 {
		start := time.Now()
		_, err := rls.ShouldRateLimit(t.Context(), req)
		slow = max(slow, time.Since(start))
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("call beyond the bound: %v, want ResourceExhausted", err)
		}
	}
	grown := runtime.NumGoroutine() - before
	rs.Resume()
	for range bound {
		if err := <-held; err != nil {
			t.Errorf("held call: %v", err)
		}
	}
	worst := noise.Stop()
	t.Logf("100 shed calls, slowest %v (noise %v); goroutines grew by %d", slow, worst, grown)
	if allow := schednoise.Allowance(worst, 50*time.Millisecond); slow > allow {
		t.Errorf("a shed call took %v, want within the noise allowance %v", slow, allow)
	}
	// The held calls' goroutines, client and server side, and gRPC's.
	if grown > 16*bound {
		t.Errorf("goroutines grew by %d with %d calls held and 100 shed", grown, bound)
	}

	done := make(chan struct{})
	wait := rlsLoad(rls, 16*bound, done)
	time.Sleep(time.Second)
	close(done)
	var admitted, shed int
	for _, c := range wait() {
		switch c.code {
		case codes.OK:
			admitted++
		case codes.ResourceExhausted:
			shed++
		default:
			t.Fatalf("under overload: %v, want OK or ResourceExhausted", c.code)
		}
	}
	t.Logf("under %d callers: %d decided, %d shed", 16*bound, admitted, shed)
	if admitted == 0 {
		t.Error("no decision under overload")
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+8 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // connections' goroutines end
	}
	if n := runtime.NumGoroutine(); n > before+8 {
		t.Errorf("%d goroutines after the overload, %d before", n, before)
	}
}
