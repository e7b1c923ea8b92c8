package server

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
)

// TestEnvoyDeploymentProbes covers the probes of envoyproxy/ratelimit's
// manifests: GET /healthcheck answers 200 "OK" (no token needed), and the
// gRPC health service knows "ratelimit", the name it registers.
func TestEnvoyDeploymentProbes(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig, func(o *Options) { o.AuthTokens = []string{"secret"} })
	if code, body := ts.get(t, "/healthcheck"); code != http.StatusOK || body != "OK" {
		t.Errorf("/healthcheck: %d %q, want 200 \"OK\"", code, body)
	}
	conn, err := grpc.NewClient(ts.grpcAdr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, name := range []string{"", "ratelimit", "envoy.service.ratelimit.v3.RateLimitService"} {
		resp, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: name})
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, %v; want SERVING", name, resp, err)
		}
	}
}

// TestReloadCounterFromStart checks that fleetrate_config_reloads_total is
// exported for every result before the first reload.
func TestReloadCounterFromStart(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	for _, r := range []string{"success", "failure", "unchanged"} {
		if !metricHas(t, ts, `fleetrate_config_reloads_total{result="`+r+`"} 0`) {
			t.Errorf("fleetrate_config_reloads_total{result=%q} is not exported at 0 before any reload", r)
		}
	}
}

// TestReloadDirectory covers envoyproxy/ratelimit's runtime directory: a
// directory of files, one domain each, reloaded as one configuration, with
// a domain split over two files merged under MERGE_DOMAIN_CONFIG
// (merge_domain_key1.yaml and merge_domain_key2.yaml).
func TestReloadDirectory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, src string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("basic.yaml", "domain: basic\ndescriptors:\n  - key: key1\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	opts := config.LoadOptions{MergeDomains: true}
	cfg, err := config.LoadPath(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, "domain: unused\n", func(o *Options) {
		o.Config, o.ConfigPath, o.ConfigOptions = cfg, dir, opts
	})
	if r := ts.should(t, "basic", 0, desc("key1", "a")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("before reload: %v", r)
	}
	write("merge1.yaml", "domain: basic\ndescriptors:\n  - key: key2\n    rate_limit: {unit: minute, requests_per_unit: 20}\n")
	if err := ts.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := ts.should(t, "basic", 0, desc("key2", "a")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 20 {
		t.Errorf("merged file's descriptor: %v, want 20/minute", r)
	}
	if r := ts.should(t, "basic", 0, desc("key1", "b")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Errorf("first file's descriptor after the merge: %v, want 1/second", r)
	}
}

// TestReloadRefusesEmptiedConfig: a reload to a configuration without a
// single limit (a truncated file, a ConfigMap key moved away) is a failed
// reload, and the limits in force keep limiting; before, it applied "no
// domains" and logged success, and a limited request came back OK.
func TestReloadRefusesEmptiedConfig(t *testing.T) {
	t.Parallel()
	ts := start(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	for _, src := range []string{"", "# nothing yet\n"} {
		if err := os.WriteFile(ts.path, []byte(src), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := ts.Reload(); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "no limits") {
			t.Fatalf("reload of %q: %v, want a refusal naming the empty configuration", src, err)
		}
		if r := ts.should(t, "d", 0, desc("k", "a")); r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
			t.Fatalf("after the refused reload of %q: %v, want the 1/second rule still in force", src, r)
		}
		if !metricHas(t, ts, "fleetrate_config_reload_failing 1") {
			t.Errorf("after the refused reload of %q the reload-failing gauge is not 1", src)
		}
	}
	// The file back to a configuration that loads: the gauge clears.
	if err := os.WriteFile(ts.path, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ts.Reload(); err != nil {
		t.Fatal(err)
	}
	if !metricHas(t, ts, "fleetrate_config_reload_failing 0") {
		t.Error("after a good reload the reload-failing gauge is not 0")
	}
}

// TestGRPCReflection: grpcurl, as docs/API.md shows it, finds the services
// through server reflection, which needs no token (as health does not);
// the RLS calls still do.
func TestGRPCReflection(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig, func(o *Options) { o.AuthTokens = []string{"secret"} })
	conn, err := grpc.NewClient(ts.grpcAdr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{"envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, want %s among them", names, want)
		}
	}
	_ = stream.CloseSend()
}

// TestShutdownEndsReflection: a reflection stream left open (grpcui keeps
// one for its session) ends when shutdown begins, instead of holding the
// graceful stop for the whole ShutdownTimeout.
func TestShutdownEndsReflection(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig, func(o *Options) { o.ShutdownTimeout = time.Minute })
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	ts.stop(t) // as SIGTERM does, and waits for Serve to return
	if _, err := stream.Recv(); err == nil {
		t.Error("the reflection stream is still open after shutdown")
	}
}
