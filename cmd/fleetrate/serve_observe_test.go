package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/fleetrate/fleetrate/internal/server"
)

// TestEnvoyEnvObserve covers envoyproxy/ratelimit's tracing, debug port,
// readiness and statistics variables.
func TestEnvoyEnvObserve(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		env   map[string]string
		want  map[string]string
		notes []string // substrings, one per note, in order
	}{
		{"tracing with its defaults", map[string]string{"TRACING_ENABLED": "true"},
			map[string]string{"tracing": "true", "tracing-service-name": "RateLimit"}, nil},
		{"tracing in full", map[string]string{"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": "rl", "TRACING_SERVICE_NAMESPACE": "ns",
			"TRACING_SERVICE_INSTANCE_ID": "pod-1", "TRACING_SAMPLING_RATE": "0.25", "TRACING_EXPORTER_PROTOCOL": "GRPC"},
			map[string]string{"tracing": "true", "tracing-protocol": "grpc", "tracing-sampling-rate": "0.25", "tracing-service-instance-id": "pod-1",
				"tracing-service-name": "rl", "tracing-service-namespace": "ns"}, nil},
		{"tracing off", map[string]string{"TRACING_ENABLED": "false"}, map[string]string{"tracing": "false"}, nil},
		{"debug port on loopback", map[string]string{"DEBUG_PORT": "6070"}, map[string]string{"debug-addr": "127.0.0.1:6070"}, nil},
		{"debug host as given", map[string]string{"DEBUG_HOST": "0.0.0.0"}, map[string]string{"debug-addr": "0.0.0.0:6070"}, nil},
		{"healthy with a config", map[string]string{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"}, map[string]string{"healthy-with-config": "true"}, nil},
		{"statsd by default", map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379"}, map[string]string{"redis": "redis://r:6379"},
			[]string{"USE_STATSD (unset, so true as envoyproxy/ratelimit's default): ignored; fleetrate sends no statsd"}},
		{"statsd host named", map[string]string{"USE_STATSD": "true", "STATSD_HOST": "statsd", "STATSD_PORT": "9125"}, map[string]string{},
			[]string{"nothing is sent to statsd:9125"}},
		{"statsd off", map[string]string{"USE_STATSD": "false", "GRPC_PORT": "8081"}, map[string]string{"grpc-addr": ":8081"}, nil},
		{"stats disabled", map[string]string{"DISABLE_STATS": "true", "GRPC_PORT": "8081"}, map[string]string{"grpc-addr": ":8081"}, nil},
		{"extra tags", map[string]string{"USE_STATSD": "false", "EXTRA_TAGS": "team:edge"}, map[string]string{}, []string{"EXTRA_TAGS: ignored"}},
		{"per-second redis", map[string]string{"USE_STATSD": "false", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "/run/persec.sock"},
			map[string]string{"redis-per-second": "unix:///run/persec.sock"}, nil},
		{"no deployment, no note", map[string]string{}, map[string]string{}, nil},
		{"startup retries", map[string]string{"USE_STATSD": "false", "REDIS_STARTUP_MAX_ELAPSED_TIME": "1m", "PROMETHEUS_MAPPER_YAML": "/m.yaml"}, map[string]string{},
			[]string{"PROMETHEUS_MAPPER_YAML: ignored", "REDIS_STARTUP_MAX_ELAPSED_TIME: ignored; fleetrate starts while Redis is away"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, notes, err := envoyEnv(envFrom(tt.env))
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			if len(notes) != len(tt.notes) {
				t.Fatalf("notes %q, want %d", notes, len(tt.notes))
			}
			for i, n := range tt.notes {
				if !strings.Contains(notes[i], n) {
					t.Errorf("note %q, want it to contain %q", notes[i], n)
				}
			}
		})
	}
}

func TestServeObserveSettingsErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"TRACING_EXPORTER_PROTOCOL": "zipkin"}, "--tracing-protocol (TRACING_EXPORTER_PROTOCOL) must be http or grpc"},
		{map[string]string{"TRACING_SAMPLING_RATE": "2"}, `--tracing-sampling-rate / FLEETRATE_TRACING_SAMPLING_RATE: invalid value "2"`},
		{map[string]string{"FLEETRATE_TRACING_ENDPOINT": "collector:4318"}, "--tracing-endpoint must be an http:// or https:// URL"},
		{map[string]string{"FLEETRATE_DEBUG_ADDR": "6070"}, "--debug-addr must be host:port"},
	} {
		c.env["FLEETRATE_CONFIG"] = serveWriteFile(t, "f.yaml", "domain: d\n")
		cmd := serveCommand(envFrom(c.env))
		if err := cmd.ParseFlags(nil); err != nil {
			t.Fatal(err)
		}
		if _, err := resolveSettings(cmd.Flags(), envFrom(c.env)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.env, err, c.want)
		}
	}
}

// collector is an OTLP trace receiver: over HTTP (protobuf) at /v1/traces
// and over gRPC; it keeps the spans it receives with their resource's
// attributes.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []receivedSpan
}

type receivedSpan struct {
	span     *tracepb.Span
	resource map[string]string
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		res := strAttrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				c.spans = append(c.spans, receivedSpan{sp, res})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (c *collector) received() []receivedSpan {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]receivedSpan(nil), c.spans...)
}

func strAttrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = fmt.Sprint(v.IntValue)
		}
	}
	return m
}

// startCollector runs c on a loopback port over protocol and returns its
// endpoint URL: the HTTP one's root, or the gRPC one's.
func startCollector(t *testing.T, c *collector, protocol string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if protocol == "grpc" {
		g := grpc.NewServer()
		coltracepb.RegisterTraceServiceServer(g, c)
		go func() { _ = g.Serve(l) }()
		t.Cleanup(g.Stop)
		return "http://" + l.Addr().String()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if err == nil {
			err = proto.Unmarshal(body, req)
		}
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, fmt.Sprintf("content type %q: %v", r.Header.Get("Content-Type"), err), http.StatusBadRequest)
			return
		}
		resp, _ := c.Export(r.Context(), req)
		out, _ := proto.Marshal(resp)
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	})
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(l) }()
	t.Cleanup(func() { hs.Close() })
	return "http://" + l.Addr().String()
}

const callerTrace = "0af7651916cd43dd8448eb211c80319c"

// tracedCall makes one RLS call with a caller's trace context and one
// POST /json, then stops serve, which flushes the spans.
func tracedCall(t *testing.T, httpAddr, grpcAddr string, stop func() error) {
	t.Helper()
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+callerTrace+"-b7ad6b7169203331-01")
	if _, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+httpAddr+"/json", "application/json", strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.2"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// checkSpans checks that c received the RLS call's span, a child of the
// caller's trace, and the /json request's, each with the decision.
func checkSpans(t *testing.T, c *collector, service, namespace string) {
	t.Helper()
	got := map[string]receivedSpan{}
	for _, s := range c.received() {
		got[s.span.Name] = s
	}
	rls, ok := got["/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"]
	if !ok {
		t.Fatalf("no RLS span among %d received", len(got))
	}
	if tid := fmt.Sprintf("%x", rls.span.TraceId); tid != callerTrace {
		t.Errorf("RLS span trace %s, want the caller's %s", tid, callerTrace)
	}
	if a := strAttrs(rls.span.Attributes); a[server.AttrDomain] != "edge" || a[server.AttrOverallCode] != "OK" || a[server.AttrDescriptors] != "1" {
		t.Errorf("RLS span attributes %v", a)
	}
	if rls.resource["service.name"] != service || rls.resource["service.namespace"] != namespace || rls.resource["service.instance.id"] == "" {
		t.Errorf("resource %v, want service.name %q, service.namespace %q and an instance id", rls.resource, service, namespace)
	}
	js, ok := got["POST /json"]
	if !ok {
		t.Fatalf("no span of POST /json among %v", got)
	}
	if a := strAttrs(js.span.Attributes); a[server.AttrDomain] != "edge" || a["http.response.status_code"] != "200" {
		t.Errorf("/json span attributes %v", a)
	}
}

// TestServeTracingOTLP runs serve with envoyproxy/ratelimit's tracing
// variables and fleetrate's --tracing-endpoint, over both OTLP protocols,
// and receives the spans on a collector the test runs.
func TestServeTracingOTLP(t *testing.T) {
	t.Parallel()
	for _, protocol := range []string{"http", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			c := &collector{}
			endpoint := startCollector(t, c, protocol)
			if protocol == "http" {
				endpoint += "/v1/traces"
			}
			env := map[string]string{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": protocol, "TRACING_SERVICE_NAMESPACE": "edge-ns"}
			path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
			h, g, _, stop := startServeEnv(t, envFrom(env), "--config", path, "--tracing-endpoint", endpoint)
			tracedCall(t, h, g, stop)
			checkSpans(t, c, "RateLimit", "edge-ns")
		})
	}
}

// TestServeTracingOTELEnv finds the collector as envoyproxy/ratelimit's
// deployments name it: OTEL_EXPORTER_OTLP_ENDPOINT, read by the OTLP
// exporter from the process's environment (so this test is not parallel).
func TestServeTracingOTELEnv(t *testing.T) {
	c := &collector{}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", startCollector(t, c, "http"))
	env := map[string]string{"TRACING_ENABLED": "true", "TRACING_SERVICE_NAME": "edge-rl"}
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	h, g, _, stop := startServeEnv(t, envFrom(env), "--config", path)
	tracedCall(t, h, g, stop)
	checkSpans(t, c, "edge-rl", "")
}

// TestServeDebugListener serves the debug endpoints on --debug-addr, and
// none without it.
func TestServeDebugListener(t *testing.T) {
	t.Parallel()
	path := serveWriteFile(t, "fleetrate.yaml", serveTestConfig)
	_, _, logs, _ := startServe(t, "--config", path, "--debug-addr", "127.0.0.1:0")
	addr, ok := logs.field("debug listener: /rlconfig, /stats, /debug/pprof/", "addr")
	if !ok {
		t.Fatalf("no debug listener line:\n%s", logs)
	}
	for _, c := range []struct{ path, want string }{
		{"/rlconfig", "edge.remote_address: 2/second, shadow_mode: false, quota_mode: false\n"},
		{"/stats", "fleetrate_"},
		{"/debug/pprof/", "goroutine"},
	} {
		resp, err := http.Get("http://" + addr.(string) + c.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), c.want) {
			t.Errorf("GET %s: %d %q, want 200 containing %q", c.path, resp.StatusCode, body, c.want)
		}
	}
	if strings.Contains(logs.String(), "non-loopback") {
		t.Errorf("warned of a loopback listener:\n%s", logs)
	}

	_, _, logs, _ = startServe(t, "--config", path)
	if _, on := logs.field("debug listener: /rlconfig, /stats, /debug/pprof/", "addr"); on {
		t.Error("debug listener on without --debug-addr")
	}
}

// TestServeHealthyWithConfig starts, as an envoyproxy/ratelimit
// deployment with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, on an empty
// configuration directory: unhealthy until a file with a domain arrives.
func TestServeHealthyWithConfig(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "rl", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true", "USE_STATSD": "false"}
	h, _, _, _ := startServeEnv(t, envFrom(env), "--reload-interval", "20ms")
	status := func(path string) int {
		resp, err := http.Get("http://" + h + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if hc, rz := status("/healthcheck"), status("/readyz"); hc != 500 || rz != 503 {
		t.Errorf("empty directory: /healthcheck %d, /readyz %d; want 500, 503", hc, rz)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for status("/healthcheck") != 200 {
		if time.Now().After(deadline) {
			t.Fatal("still unhealthy 10 s after a configuration with a domain was written")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rz := status("/readyz"); rz != 200 {
		t.Errorf("configured: /readyz %d, want 200", rz)
	}
}
