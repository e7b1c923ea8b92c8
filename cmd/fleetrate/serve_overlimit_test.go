package main

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestServeLocalCache runs the service with --local-cache-bytes: of 50
// requests of one client over its limit of 2 an hour, the store sees the
// two grants and the first denial, and the cache answers the 47 others;
// the metrics say so.
func TestServeLocalCache(t *testing.T) {
	t.Parallel()
	path := serveWriteFile(t, "fleetrate.yaml", `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 2}
`)
	httpAddr, grpcAddr, _, _ := startServe(t, "--config", path, "--local-cache-bytes", "65536")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.1.2.3"}}}}}
	over := 0
	for range 50 {
		resp, err := rls.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT {
			over++
			if st := resp.Statuses[0]; st.LimitRemaining != 0 || st.DurationUntilReset.AsDuration().Seconds() < 1700 {
				t.Fatalf("a denial: %v, want 0 left and about 30 minutes to wait", st)
			}
		}
	}
	if over != 48 {
		t.Fatalf("%d of 50 over the limit, want 48", over)
	}
	metrics := metricsOf(t, httpAddr)
	for name, want := range map[string]int{
		`fleetrate_overlimit_cache_hits_total`:                                       47,
		`fleetrate_overlimit_cache_misses_total`:                                     3,
		`fleetrate_store_duration_seconds_count{op="take"}`:                          3,
		`fleetrate_overlimit_cache_entries`:                                          1,
		`fleetrate_near_limit_total{descriptor="edge.remote_address",domain="edge"}`: 1,
	} {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(metrics)
		if m == nil || m[1] != strconv.Itoa(want) {
			t.Errorf("%s = %v, want %d", name, m, want)
		}
	}
}
