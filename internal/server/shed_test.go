package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/internal/server/wire"
	"github.com/fleetrate/fleetrate/memstore"
)

// TestShedBeyondMaxInFlight holds MaxInFlight decisions in the store and
// checks that the next RLS call is RESOURCE_EXHAUSTED and the next API
// request 503 with Retry-After, at once, while the probes and metrics
// are served; and that decisions are admitted again once the held ones
// end.
func TestShedBeyondMaxInFlight(t *testing.T) {
	g := &gatedStore{Store: memstore.New(memstore.Options{}), gate: make(chan struct{})}
	ts := start(t, rlsConfig, func(o *Options) { o.Store, o.MaxInFlight, o.StoreTimeout = g, 2, time.Minute })
	held := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := ts.rls.ShouldRateLimit(ctxT(t), rlsRequest("edge", 1, desc("remote_address", "10.0.0.1")))
			held <- err
		}()
	}
	for g.waiting.Load() < 2 {
		time.Sleep(time.Millisecond) // the two calls reach the store
	}
	_, err := ts.rls.ShouldRateLimit(ctxT(t), rlsRequest("edge", 1, desc("remote_address", "10.0.0.2")))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-in-flight") {
		t.Errorf("third RLS call: %v, want RESOURCE_EXHAUSTED naming --max-in-flight", err)
	}
	req, _ := http.NewRequestWithContext(ctxT(t), http.MethodPost, ts.url+"/v1/take", strings.NewReader(`{"bucket":"b"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body wire.Error
	_ = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || body.Code != codeOverloaded {
		t.Errorf("API request beyond the bound: %d, Retry-After %q, code %q; want 503, 1, %q", resp.StatusCode, resp.Header.Get("Retry-After"), body.Code, codeOverloaded)
	}
	if code, _ := ts.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz under overload: %d", code)
	}
	_, metrics := ts.get(t, "/metrics")
	for _, want := range []string{`fleetrate_shed_total{api="grpc"} 1`, `fleetrate_shed_total{api="http"} 1`, `fleetrate_max_in_flight 2`, `fleetrate_concurrency_limit 2`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	close(g.gate)
	for range 2 {
		if err := <-held; err != nil {
			t.Errorf("held call: %v", err)
		}
	}
	if _, err := ts.rls.ShouldRateLimit(ctxT(t), rlsRequest("edge", 1, desc("remote_address", "10.0.0.3"))); err != nil {
		t.Errorf("call after the held ones ended: %v", err)
	}
}

// TestReadyzShowsBreaker puts a failsafe breaker with the fail_open policy
// in front of a store that is down: /readyz fails (the policy, not the
// store, answers) and reports the breaker open.
func TestReadyzShowsBreaker(t *testing.T) {
	fs, err := failsafe.New(failingStore{}, failsafe.Options{Policy: failsafe.FailOpen, Logger: quietLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ts := start(t, rlsConfig, func(o *Options) { o.Store, o.Breaker = fs, fs })
	var code int
	var body map[string]string
	for range failsafe.DefaultFailureThreshold + 1 {
		code = ts.get2(t, "/readyz", &body)
	}
	if code != http.StatusServiceUnavailable || body["breaker"] != "open" || body["error"] != errDegraded.Error() {
		t.Errorf("/readyz with the store down: %d %v, want 503 with breaker open and %q", code, body, errDegraded)
	}
}

func (ts *testServer) get2(t *testing.T, path string, out any) int {
	t.Helper()
	code, data := ts.get(t, path)
	if err := json.Unmarshal([]byte(data), out); err != nil {
		t.Fatalf("GET %s: %d %q: %v", path, code, data, err)
	}
	return code
}

func rlsRequest(domain string, hits uint32, ds ...*rlcommon.RateLimitDescriptor) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits}
}
