package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/fleetrate/fleetrate/internal/config"
)

const (
	exampleConfig = "../../examples/fleetrate.yaml"
	exampleEnvoy  = "../../examples/envoy/envoy.yaml"
	examplePython = "../../examples/python/decide_worker.py"
	// The outbound worker on the fleetrate package and its configuration.
	exampleOutboundPython = "../../examples/python/worker.py"
	exampleOutboundConfig = "../../examples/python/fleetrate.yaml"
)

func TestServeExampleConfigLoads(t *testing.T) {
	t.Parallel()
	cfg, err := config.LoadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Domain("edge") == nil {
		t.Error("examples/fleetrate.yaml has no domain edge")
	}
	if _, ok := cfg.Bucket("booking_com/availability"); !ok {
		t.Error("examples/fleetrate.yaml has no bucket booking_com/availability")
	}
}

// TestExampleEnvoyConfig parses examples/envoy/envoy.yaml into Envoy's own
// bootstrap proto, with every typed config resolved, and runs Envoy's
// validation rules on it; then checks that it points at fleetrate.
func TestServeExampleEnvoyConfig(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile(exampleEnvoy)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(src, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrap.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("envoy.yaml is not a valid Envoy v3 bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("envoy.yaml fails Envoy's validation: %v", err)
	}
	var manager hcm.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&manager); err != nil {
		t.Fatal(err)
	}
	var rl ratelimitfilter.RateLimit
	if err := manager.HttpFilters[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Domain(rl.Domain) == nil {
		t.Errorf("the filter's domain %q is not in examples/fleetrate.yaml", rl.Domain)
	}
	for _, c := range b.StaticResources.Clusters {
		if c.Name != rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName() {
			continue
		}
		port := c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address.GetSocketAddress().GetPortValue()
		if port != 8081 {
			t.Errorf("fleetrate cluster port %d, want the default gRPC port 8081", port)
		}
		return
	}
	t.Error("no cluster for the rate limit service")
}

// TestExamplePythonWorker runs the standard-library Python worker against
// the service: its calls are paced by the shared bucket.
func TestServeExamplePythonWorker(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	httpAddr, _, _, stop := startServe(t, "--config", exampleConfig)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// booking_com/availability: 20/s in bursts of 40. 50 calls take the
	// burst at once, then 10 more at 20/s: about half a second.
	start := time.Now()
	out, err := exec.CommandContext(ctx, python, examplePython, "--url", "http://"+httpAddr,
		"--bucket", "booking_com/availability", "--workers", "8", "--calls", "50").CombinedOutput()
	if err != nil {
		t.Fatalf("worker.py: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`done: 50 calls in ([0-9.]+)s`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("unexpected output:\n%s", out)
	}
	took, _ := strconv.ParseFloat(string(m[1]), 64)
	if took < 0.4 || time.Since(start) > 20*time.Second {
		t.Errorf("50 calls took %.3fs, want about 0.5s (paced by the bucket)", took)
	}
}

// TestServeExamplePythonWorkerWrongToken checks that the outbound Python
// worker stops on a 401 instead of treating it as an outage: with
// --on-error open it would otherwise send every call unpaced.
func TestServeExamplePythonWorkerWrongToken(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	tokens := serveWriteFile(t, "tokens", "right-token\n")
	httpAddr, _, _, stop := startServe(t, "--config", exampleOutboundConfig, "--auth-token-file", tokens)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, exampleOutboundPython, "--url", "http://"+httpAddr, "--token", "wrong-token",
		"--on-error", "open", "--workers", "2", "--calls", "5").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "HTTP 401") || strings.Contains(string(out), "going ahead") {
		t.Errorf("worker.py with a wrong token: %v\n%s\nwant it to stop on HTTP 401 without going ahead", err, out)
	}
}

// TestServeExamplePythonOutboundWorker runs examples/python/worker.py, a
// fleet of asyncio workers on the fleetrate package, against the service
// with examples/python/fleetrate.yaml: its calls to the stand-in API are
// paced at the availability endpoint's 20/s, and the stand-in's one 429
// (the 20th request) pauses the fleet and is sent again, so that every
// call is answered.
func TestServeExamplePythonOutboundWorker(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	httpAddr, _, _, stop := startServe(t, "--config", exampleOutboundConfig)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, exampleOutboundPython, "--url", "http://"+httpAddr,
		"--workers", "8", "--calls", "30", "--surprise-429", "20").CombinedOutput()
	if err != nil {
		t.Fatalf("worker.py: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`done: 30 calls in ([0-9.]+)s \([0-9.]+/s\) on booking_com: 30 answered, 0 gave up, 0 unpaced`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("unexpected output:\n%s", out)
	}
	// 30 calls at 20/s take 1.45 s; the 429's pause (Retry-After: 1)
	// holds the fleet for a second more.
	if took, _ := strconv.ParseFloat(string(m[1]), 64); took < 2 {
		t.Errorf("30 calls with a 1 s pause took %.3fs, want at least 2 s (paced, then paused)\n%s", took, out)
	}
	if !regexp.MustCompile(`upstream: 3[0-9] requests, [1-9][0-9]* answered 429`).Match(out) {
		t.Errorf("want the stand-in's 429 sent again, and few requests beyond the 30 calls\n%s", out)
	}
}
