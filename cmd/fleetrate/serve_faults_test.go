package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
)

var serveFaults = flag.Bool("servefaults", false, "TestServeFailureModes: measure fleetrate serve's row of the failure-mode table in docs/OPERATIONS.md")

// serveFaultConfig has limits no test reaches, so that every answer is a
// grant or a failure.
const serveFaultConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000}
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: second, requests_per_unit: 1000000}
`

// serveFault takes Redis away for about a second; back brings it back
// (or waits until it is).
type serveFault struct {
	name string
	away func(t *testing.T, rs *redistest.Server) (back func())
}

func serveFaultList() []serveFault {
	do := func(t *testing.T, rs *redistest.Server, args ...any) {
		if _, err := rs.Do(args...); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	return []serveFault{
		{"kill -9 and restart", func(_ *testing.T, rs *redistest.Server) func() {
			rs.Kill()
			time.Sleep(time.Second)
			return rs.Restart
		}},
		{"SIGSTOP and SIGCONT", func(_ *testing.T, rs *redistest.Server) func() {
			rs.Pause()
			time.Sleep(time.Second)
			return rs.Resume
		}},
		{"SCRIPT FLUSH", func(t *testing.T, rs *redistest.Server) func() {
			do(t, rs, "script", "flush")
			time.Sleep(time.Second)
			return func() {}
		}},
		{"OOM (maxmemory 1, noeviction)", func(t *testing.T, rs *redistest.Server) func() {
			do(t, rs, "config", "set", "maxmemory-policy", "noeviction")
			do(t, rs, "config", "set", "maxmemory", "1")
			time.Sleep(time.Second)
			return func() { do(t, rs, "config", "set", "maxmemory", "0") }
		}},
		{"CLIENT PAUSE", func(t *testing.T, rs *redistest.Server) func() {
			do(t, rs, "client", "pause", "1000", "all")
			time.Sleep(time.Second)
			return func() {}
		}},
		{"DEBUG SLEEP", func(t *testing.T, rs *redistest.Server) func() {
			done := make(chan struct{})
			go func() { defer close(done); do(t, rs, "debug", "sleep", "1") }()
			return func() { <-done }
		}},
	}
}

// TestServeFailureModes measures `fleetrate serve` over Redis under each
// fault of the failure-mode table: 32 clients (16 over HTTP /v1/take, 16
// over gRPC ShouldRateLimit), Redis away for a second, batched and not,
// with the default --store-timeout and with 50 ms. It logs, per fault, the
// latency of the decisions that began while Redis was away, what they
// answered, and how long after Redis was back the slowest client's first
// grant came. Run it with -servefaults.
func TestServeFailureModes(t *testing.T) {
	if !*serveFaults {
		t.Skip("set -servefaults to measure")
	}
	path := serveWriteFile(t, "fleetrate.yaml", serveFaultConfig)
	for _, timeout := range []string{"", "50ms"} {
		for _, batch := range []string{"true", "false"} {
			for _, f := range serveFaultList() {
				rs := redistest.Start(t, "--enable-debug-command", "yes")
				args := []string{"--config", path, "--redis", rs.URL(), "--redis-batch=" + batch}
				if timeout != "" {
					args = append(args, "--store-timeout", timeout)
				}
				r := serveUnderFault(t, rs, f, args)
				name := "default (1s)"
				if timeout != "" {
					name = timeout
				}
				t.Logf("| %s | store-timeout %s, redis-batch=%s | p99 %v max %v over %d | %s | back p50 %v p99 %v max %v | noise %v |",
					f.name, name, batch, quantileOf(r.latencies, 0.99), slices.Max(r.latencies), len(r.latencies), r.outcomes,
					quantileOf(r.back, 0.5), quantileOf(r.back, 0.99), slices.Max(r.back), r.noise)
				rs.Stop()
			}
		}
	}
}

type serveFaultResult struct {
	latencies []time.Duration // of decisions that began while away
	back      []time.Duration // per client: from back to its first grant's end
	outcomes  string
	noise     time.Duration
}

func serveUnderFault(t *testing.T, rs *redistest.Server, f serveFault, args []string) serveFaultResult {
	httpAddr, grpcAddr, _, stop := startServe(t, args...)
	defer stop()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	url := "http://" + httpAddr + "/v1/take"
	// decide makes one decision for client i and reports whether it was
	// granted, and its outcome's name.
	decide := func(i int) (bool, string) {
		if i%2 == 0 {
			code, err := hungPost(client, url, `{"bucket":"booking_com/availability","n":1}`)
			if err != nil {
				return false, "HTTP error"
			}
			return code == http.StatusOK, fmt.Sprintf("HTTP %d", code)
		}
		resp, err := rls.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
			Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: fmt.Sprint("10.0.0.", i)}}}}})
		if err != nil {
			return false, "gRPC " + grpcCode(err)
		}
		return resp.OverallCode == rlspb.RateLimitResponse_OK, "gRPC " + resp.OverallCode.String()
	}
	for i := range 32 { // connected, scripts loaded
		if ok, out := decide(i); !ok {
			t.Fatalf("before the fault: %s", out)
		}
	}
	var (
		mu        sync.Mutex
		r         serveFaultResult
		counts    = map[string]int{}
		backAt    time.Time
		stopAt    time.Time
		firstBack = make([]time.Duration, 32) // -1: no grant within 2 s
		wg        sync.WaitGroup
	)
	setBack := func(at time.Time) { mu.Lock(); backAt, stopAt = at, at.Add(2*time.Second); mu.Unlock() }
	for i := range firstBack {
		firstBack[i] = -1
	}
	watch := schednoise.Start()
	for i := range 32 {
		wg.Go(func() {
			for {
				start := time.Now()
				ok, out := decide(i)
				end := time.Now()
				mu.Lock()
				b, s := backAt, stopAt
				if b.IsZero() || start.Before(b) {
					r.latencies = append(r.latencies, end.Sub(start))
					counts[out]++
				} else if ok && firstBack[i] < 0 {
					firstBack[i] = end.Sub(b)
				}
				mu.Unlock()
				if !s.IsZero() && end.After(s) {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	back := f.away(t, rs)
	back()
	setBack(time.Now())
	wg.Wait()
	r.noise = watch.Stop()
	for _, d := range firstBack {
		if d < 0 {
			r.outcomes += "a client had no grant within 2 s of Redis being back; "
			d = 2 * time.Second
		}
		r.back = append(r.back, d)
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		r.outcomes += fmt.Sprintf("%s: %d; ", k, counts[k])
	}
	return r
}

func grpcCode(err error) string { return status.Code(err).String() }

func quantileOf(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}
