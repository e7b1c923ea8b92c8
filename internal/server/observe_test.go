package server

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
)

const observeConfig = `domain: rl
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// attrs maps a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracingSpansOfDecisions(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ts := start(t, observeConfig, func(o *Options) { o.Tracer = tp })

	// The caller's trace: the server's span must be its child.
	parent := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "traceparent", parent)
	for range 2 { // OK, then OVER_LIMIT
		if _, err := ts.rls.ShouldRateLimit(ctx, &rlspb.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "v")}}); err != nil {
			t.Fatal(err)
		}
	}
	if code := ts.post(t, "/json", `{"domain":"rl","descriptors":[{"entries":[{"key":"k","value":"w"}]}]}`, nil, "traceparent", parent); code != http.StatusOK {
		t.Fatalf("/json: %d", code)
	}
	// A health check makes no span.
	if _, err := healthpb.NewHealthClient(ts.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}

	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("got %d spans, want 3 (two RLS calls, one /json)", len(spans))
	}
	wantCodes := []string{"OK", "OVER_LIMIT", "OK"}
	for i, s := range spans {
		a := attrs(s)
		if s.SpanKind() != trace.SpanKindServer || s.Parent().TraceID().String() != "0af7651916cd43dd8448eb211c80319c" || s.Parent().SpanID().String() != "b7ad6b7169203331" {
			t.Errorf("span %d %q: kind %v, parent %v; want a server span, child of the caller's", i, s.Name(), s.SpanKind(), s.Parent())
		}
		if a[AttrDomain].AsString() != "rl" || a[AttrDescriptors].AsInt64() != 1 || a[AttrOverallCode].AsString() != wantCodes[i] {
			t.Errorf("span %d %q: attributes %v; want domain rl, 1 descriptor, code %s", i, s.Name(), a, wantCodes[i])
		}
	}
	if n := spans[0].Name(); n != "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" {
		t.Errorf("RLS span name %q", n)
	}
	if n, code := spans[2].Name(), attrs(spans[2])["http.response.status_code"].AsInt64(); n != "POST /json" || code != 200 {
		t.Errorf("HTTP span: name %q, status %d; want POST /json, 200", n, code)
	}
}

func TestTracingOffByDefault(t *testing.T) {
	t.Parallel()
	ts := start(t, observeConfig)
	if ts.tracing != nil {
		t.Fatal("tracing on without Options.Tracer")
	}
	h := ts.traced(func(http.ResponseWriter, *http.Request) {})
	if h == nil {
		t.Fatal("traced returned nil")
	}
}

func TestHealthyWithConfig(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			t.Parallel()
			ts := start(t, "# no domain yet\n", func(o *Options) { o.HealthyWithConfig = on })
			hc := healthpb.NewHealthClient(ts.conn)
			check := func() (healthpb.HealthCheckResponse_ServingStatus, int, int) {
				t.Helper()
				r, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "ratelimit"})
				if err != nil {
					t.Fatal(err)
				}
				hcCode, _ := ts.get(t, "/healthcheck")
				ready, _ := ts.get(t, "/readyz")
				return r.Status, hcCode, ready
			}
			g, h, r := check()
			if on && (g != healthpb.HealthCheckResponse_NOT_SERVING || h != 500 || r != 503) {
				t.Errorf("empty config: health %v, /healthcheck %d, /readyz %d; want NOT_SERVING, 500, 503", g, h, r)
			}
			if !on && (g != healthpb.HealthCheckResponse_SERVING || h != 200 || r != 200) {
				t.Errorf("empty config, option off: health %v, /healthcheck %d, /readyz %d; want SERVING, 200, 200", g, h, r)
			}
			writeAtomic(t, ts.path, observeConfig)
			if err := ts.Reload(); err != nil {
				t.Fatal(err)
			}
			if g, h, r := check(); g != healthpb.HealthCheckResponse_SERVING || h != 200 || r != 200 {
				t.Errorf("config with a domain: health %v, /healthcheck %d, /readyz %d; want SERVING, 200, 200", g, h, r)
			}
		})
	}
}

func TestDebugHandler(t *testing.T) {
	t.Parallel()
	ts := start(t, observeConfig+`  - key: free
    rate_limit: {unlimited: true}
`)
	ts.should(t, "rl", 1, desc("k", "v"))
	dbg := httptest.NewServer(ts.DebugHandler())
	t.Cleanup(dbg.Close)
	get := func(path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctxT(t), http.MethodGet, dbg.URL+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	for _, c := range []struct{ path, want string }{
		{"/", "/rlconfig: "},
		{"/rlconfig", "rl.free: unlimited, shadow_mode: false, quota_mode: false\nrl.k: 1/minute, shadow_mode: false, quota_mode: false\n"},
		{"/stats", `fleetrate_decisions_total{`},
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/cmdline", ""},
	} {
		code, body := get(c.path)
		if code != http.StatusOK || !strings.Contains(body, c.want) {
			t.Errorf("GET %s: %d %q; want 200 containing %q", c.path, code, body, c.want)
		}
	}
	if code, _ := get("/nope"); code != http.StatusNotFound {
		t.Errorf("GET /nope: %d, want 404", code)
	}
}

// TestYearLimitOverRLS serves envoyproxy/ratelimit's unit: year: two a
// year, then OVER_LIMIT until the next token, half a year on.
func TestYearLimitOverRLS(t *testing.T) {
	t.Parallel()
	ts := start(t, "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 2}\n")
	for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		resp := ts.should(t, "rl", 1, desc("k", "v"))
		if resp.OverallCode != want {
			t.Fatalf("call %d: %v, want %v", i+1, resp.OverallCode, want)
		}
		if i == 2 {
			d := resp.Statuses[0].GetDurationUntilReset().AsDuration()
			if half := 365 * 24 * time.Hour / 2; d < half-time.Second || d > 365*24*time.Hour {
				t.Errorf("duration until reset %v, want between half a year and a year", d)
			}
		}
	}
}
