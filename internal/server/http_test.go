package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/server/wire"
)

const bucketConfig = rlsConfig + `
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: second, requests_per_unit: 10, burst: 2}
  - channel: booking_com
    rate_limit: {unit: second, requests_per_unit: 100}
  - name: expedia/search
    rate_limit: {unit: minute, requests_per_unit: 60}
`

func metricHas(t *testing.T, ts *testServer, line string) bool {
	t.Helper()
	code, body := ts.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	return strings.Contains(body, line)
}

func TestJSONEndpoint(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	body := `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"j"}]}]}`
	var resp map[string]any
	for i := 0; i < 3; i++ {
		if code := ts.post(t, "/json", body, &resp); code != http.StatusOK {
			t.Fatalf("request %d: status %d, body %v", i, code, resp)
		}
	}
	if resp["overallCode"] != "OK" {
		t.Errorf("overallCode = %v", resp["overallCode"])
	}
	code := ts.post(t, "/json", body, &resp)
	if code != http.StatusTooManyRequests || resp["overallCode"] != "OVER_LIMIT" {
		t.Errorf("4th: status %d body %v, want 429 OVER_LIMIT", code, resp)
	}
	st := resp["statuses"].([]any)[0].(map[string]any)
	if cl := st["currentLimit"].(map[string]any); cl["requestsPerUnit"] != float64(3) || cl["unit"] != "SECOND" {
		t.Errorf("currentLimit = %v", cl)
	}
	// snake_case and descriptor-level hits_addend are accepted too.
	peek := `{"domain":"edge","hits_addend":1,"descriptors":[{"entries":[{"key":"remote_address","value":"j2"}],"hits_addend":"0"}]}`
	if code := ts.post(t, "/json", peek, &resp); code != http.StatusOK {
		t.Errorf("peek: %d %v", code, resp)
	}
}

func TestBadRequestsGet400AndServiceKeepsServing(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig, func(o *Options) { o.MaxRequestBytes = 4096 })
	huge := `{"domain":"edge","descriptors":[{"entries":[{"key":"k","value":"` + strings.Repeat("x", 5000) + `"}]}]}`
	tests := []struct {
		name, path, body, code, msg string
	}{
		{"malformed JSON", "/json", `{"domain": "edge",`, wire.CodeInvalidJSON, "unexpected"},
		{"not JSON", "/json", `hello`, wire.CodeInvalidJSON, "invalid value"},
		{"empty body", "/json", ``, wire.CodeInvalidJSON, "empty"},
		{"huge body", "/json", huge, wire.CodeBodyTooLarge, "larger than the limit of 4096 bytes"},
		{"negative hits_addend", "/json", `{"domain":"edge","hits_addend":-1,"descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, wire.CodeInvalidJSON, "hits"},
		{"negative descriptor hits_addend", "/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"a","value":"b"}],"hits_addend":-2}]}`, wire.CodeInvalidJSON, "hits"},
		{"unknown field", "/json", `{"domain":"edge","colour":"red","descriptors":[]}`, wire.CodeInvalidJSON, `unknown field "colour"`},
		{"missing domain", "/json", `{"descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`, wire.CodeInvalid, "domain: must not be empty"},
		{"no descriptors", "/json", `{"domain":"edge"}`, wire.CodeInvalid, "descriptors"},
		{"take malformed", "/v1/take", `{"bucket":`, wire.CodeInvalidJSON, "malformed JSON"},
		{"take unknown field", "/v1/take", `{"bucket":"booking_com","count":1}`, wire.CodeInvalidJSON, `unknown field "count"`},
		{"take negative n", "/v1/take", `{"bucket":"booking_com","n":-1}`, wire.CodeInvalid, "n: must be >= 0, got -1"},
		{"take wrong type", "/v1/take", `{"bucket":"booking_com","n":"one"}`, wire.CodeInvalidJSON, `field "n"`},
		{"take fractional n", "/v1/take", `{"bucket":"booking_com","n":1.5}`, wire.CodeInvalidJSON, `field "n"`},
		{"take no bucket", "/v1/take", `{"n":1}`, wire.CodeInvalid, "bucket: required"},
		{"take unknown bucket", "/v1/take", `{"bucket":"nope"}`, wire.CodeUnknownBucket, `bucket "nope" is not configured; configured: booking_com/availability`},
		{"take both", "/v1/take", `{"bucket":"booking_com","buckets":["booking_com"]}`, wire.CodeInvalid, "not both"},
		{"take twice", "/v1/take", `{"buckets":["booking_com","{booking_com}"]}`, wire.CodeInvalid, "named twice"},
		{"take over burst", "/v1/take", `{"bucket":"booking_com/availability","n":3}`, wire.CodeBurstExceeded, "exceeds burst"},
		{"take trailing", "/v1/take", `{"bucket":"booking_com"} {}`, wire.CodeInvalidJSON, "after the JSON object"},
		{"wait negative", "/v1/wait", `{"bucket":"booking_com","max_wait_ms":-5}`, wire.CodeInvalid, "max_wait_ms: must be between 0"},
		{"drain both", "/v1/drain", `{"bucket":"booking_com","pause_ms":1,"until":"2030-01-01T00:00:00Z"}`, wire.CodeInvalid, "not both"},
		{"drain without a pause", "/v1/drain", `{"bucket":"booking_com"}`, wire.CodeInvalid, "pause_ms or until is required"},
		{"drain too long", "/v1/drain", `{"bucket":"booking_com","pause_ms":1e15}`, wire.CodeInvalid, "pause_ms"},
		{"refund negative", "/v1/refund", `{"bucket":"booking_com","n":-3}`, wire.CodeInvalid, "n: must be >= 0"},
		{"store take invalid", wire.TakePath, `{"buckets":[{"key":"k","limits":[{"rate":0,"burst":1}]}],"n":1}`, wire.CodeInvalid, "rate must be positive"},
		{"store take no buckets", wire.TakePath, `{"n":1}`, wire.CodeInvalid, "at least one bucket"},
		// Bounds the store checks itself: its answer is still a 400 naming the value.
		{"store refund negative", wire.RefundPath, `{"buckets":[{"prefix":"fleetrate:","key":"raw","limits":[{"rate":1,"burst":2}]}],"n":-1}`, wire.CodeInvalid, "got -1"},
		{"store refund huge", wire.RefundPath, `{"buckets":[{"prefix":"fleetrate:","key":"raw","limits":[{"rate":1,"burst":2}]}],"n":1000000000000000}`, wire.CodeInvalid, "n: must be at most"},
		{"store drain negative", wire.DrainPath, `{"buckets":[{"prefix":"fleetrate:","key":"raw","limits":[{"rate":1,"burst":2}]}],"duration_ns":-1}`, wire.CodeInvalid, "-1ns"},
		{"store drain too long", wire.DrainPath, `{"buckets":[{"prefix":"fleetrate:","key":"raw","limits":[{"rate":1,"burst":2}]}],"duration_ns":1000000000000000000}`, wire.CodeInvalid, "drain duration must be between"},
		{"store cancel bad booking", wire.CancelPath, `{"buckets":[{"prefix":"fleetrate:","key":"raw","limits":[{"rate":1,"burst":2}]}],"n":1,"booking":{"stamp_unix_micro":1,"debts_ns":[1,2]}}`, wire.CodeInvalid, "booking"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e wire.Error
			code := ts.post(t, tt.path, tt.body, &e)
			if code != http.StatusBadRequest {
				t.Errorf("status %d, want 400 (body %+v)", code, e)
			}
			if e.Code != tt.code || !strings.Contains(e.Error, tt.msg) {
				t.Errorf("error %+v, want code %q and a message containing %q", e, tt.code, tt.msg)
			}
		})
	}
	var resp map[string]any
	if code := ts.post(t, "/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"ok"}]}]}`, &resp); code != http.StatusOK {
		t.Errorf("a good request after the bad ones: %d %v", code, resp)
	}
	var d Decision
	if code := ts.post(t, "/v1/take", `{"bucket":"booking_com"}`, &d); code != http.StatusOK || !d.Allowed {
		t.Errorf("a good take after the bad ones: %d %+v", code, d)
	}
}

func TestTake(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig)
	var d Decision
	for i := int64(1); i >= 0; i-- {
		if code := ts.post(t, "/v1/take", map[string]any{"buckets": []string{"booking_com/availability", "booking_com"}}, &d); code != 200 || !d.Allowed || d.Remaining != i {
			t.Fatalf("take: %d %+v, want allowed with %d left", code, d, i)
		}
	}
	if d.Bucket != "booking_com/availability" || d.Limit.Burst != 2 || d.Limit.Rate != 10 {
		t.Errorf("deciding bucket %q limit %+v", d.Bucket, d.Limit)
	}
	code := ts.post(t, "/v1/take", map[string]any{"bucket": "booking_com/availability"}, &d)
	if code != 200 || d.Allowed || d.RetryAfterMS != 100 {
		t.Errorf("empty bucket: %d %+v, want denied with retry after 100ms", code, d)
	}
	// All or nothing: the channel-wide bucket was not charged by the denial.
	ts.post(t, "/v1/take", map[string]any{"bucket": "booking_com", "n": 0}, &d)
	if !d.Allowed || d.Remaining != 98 || d.N != 0 {
		t.Errorf("peek: %+v, want 98 left", d)
	}
	if !metricHas(t, ts, `fleetrate_decisions_total{api="take",descriptor="booking_com/availability",domain="",result="over_limit"} 1`) {
		t.Error("take over_limit not counted")
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig)
	var d Decision
	want := []float64{0, 0, 100, 200, 300}
	for i, w := range want {
		if code := ts.post(t, "/v1/wait", map[string]any{"bucket": "booking_com/availability", "max_wait_ms": 300}, &d); code != 200 || !d.Allowed || d.WaitMS != w {
			t.Fatalf("wait %d: %d %+v, want allowed after %vms", i, code, d, w)
		}
	}
	if d.MaxWaitMS == nil || *d.MaxWaitMS != 300 {
		t.Errorf("max_wait_ms echoed %v", d.MaxWaitMS)
	}
	code := ts.post(t, "/v1/wait", map[string]any{"bucket": "booking_com/availability", "max_wait_ms": 300}, &d)
	if code != 200 || d.Allowed || d.RetryAfterMS != 400 {
		t.Errorf("beyond max wait: %d %+v, want denied, retry after 400ms", code, d)
	}
	// The server caps the max wait at its own (5 s by default).
	ts.post(t, "/v1/wait", map[string]any{"bucket": "expedia/search", "max_wait_ms": 60000}, &d)
	if *d.MaxWaitMS != 5000 {
		t.Errorf("max wait %v, want capped at 5000", *d.MaxWaitMS)
	}
}

func TestRefundDrainReset(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig)
	var d Decision
	var done Done
	ts.post(t, "/v1/take", map[string]any{"bucket": "booking_com/availability", "n": 2}, &d)
	if d.AtUnixMicro <= 0 {
		t.Fatalf("a decision without its time: %+v", d)
	}
	if code := ts.post(t, "/v1/refund", map[string]any{"bucket": "booking_com/availability"}, &done); code != 400 {
		t.Fatalf("refund without the grant's time: %d %+v, want 400", code, done)
	}
	if code := ts.post(t, "/v1/refund", map[string]any{"bucket": "booking_com/availability", "at_unix_micro": d.AtUnixMicro}, &done); code != 200 || !done.OK {
		t.Fatalf("refund: %d %+v", code, done)
	}
	ts.post(t, "/v1/take", map[string]any{"bucket": "booking_com/availability", "n": 0}, &d)
	if d.Remaining != 1 {
		t.Errorf("after refund remaining %d, want 1", d.Remaining)
	}
	if code := ts.post(t, "/v1/drain", map[string]any{"bucket": "booking_com/availability", "pause_ms": 1500}, &done); code != 200 || *done.PauseMS != 1500 {
		t.Fatalf("drain: %d %+v", code, done)
	}
	ts.post(t, "/v1/take", map[string]any{"bucket": "booking_com/availability"}, &d)
	if d.Allowed || d.RetryAfterMS != 1600 {
		t.Errorf("drained: %+v, want denied for 1500ms + one token", d)
	}
	until := ts.clock.Now().Add(10 * time.Second).Format(time.RFC3339Nano)
	if code := ts.post(t, "/v1/drain", map[string]any{"bucket": "expedia/search", "until": until}, &done); code != 200 || *done.PauseMS != 10000 {
		t.Errorf("drain until: %d %+v", code, done)
	}
	if code := ts.post(t, "/v1/reset", map[string]any{"buckets": []string{"booking_com/availability", "expedia/search"}}, &done); code != 200 {
		t.Fatalf("reset: %d", code)
	}
	ts.post(t, "/v1/take", map[string]any{"bucket": "booking_com/availability", "n": 0}, &d)
	if !d.Allowed || d.Remaining != 2 {
		t.Errorf("after reset: %+v, want full", d)
	}
}

func TestHealthReadyMetrics(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig)
	if code, body := ts.get(t, "/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/healthz: %d %s", code, body)
	}
	if code, body := ts.get(t, "/readyz"); code != 200 {
		t.Errorf("/readyz: %d %s", code, body)
	}
	ts.should(t, "edge", 0, desc("remote_address", "m"))
	_, body := ts.get(t, "/metrics")
	for _, want := range []string{
		`fleetrate_decisions_total{api="rls",descriptor="edge.remote_address",domain="edge",result="allowed"} 1`,
		`fleetrate_store_duration_seconds_bucket{op="take"`,
		`fleetrate_config_reloads_total`,
		`fleetrate_requests_in_flight`,
		`go_goroutines`,
	} {
		if !strings.Contains(body, want) && want != "fleetrate_config_reloads_total" {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	down := start(t, bucketConfig, func(o *Options) { o.Store = failingStore{} })
	if code, body := down.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "store unavailable") {
		t.Errorf("/readyz with the store down: %d %s", code, body)
	}
	if code, _ := down.get(t, "/healthz"); code != 200 {
		t.Errorf("/healthz with the store down: %d, want 200 (alive)", code)
	}
	var e wire.Error
	if code := down.post(t, "/v1/take", `{"bucket":"booking_com"}`, &e); code != http.StatusServiceUnavailable || e.Code != wire.CodeStoreUnavailable {
		t.Errorf("take with the store down: %d %+v, want 503", code, e)
	}
}

func TestHTTPAuthAndRouting(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig, func(o *Options) { o.AuthTokens = []string{"tok"} })
	var e wire.Error
	if code := ts.post(t, "/v1/take", `{"bucket":"booking_com"}`, &e); code != http.StatusUnauthorized || e.Code != wire.CodeUnauthorized {
		t.Errorf("no token: %d %+v", code, e)
	}
	if code := ts.post(t, "/v1/take", `{"bucket":"booking_com"}`, &e, "Authorization", "Bearer wrong"); code != http.StatusUnauthorized {
		t.Errorf("wrong token: %d", code)
	}
	var d Decision
	if code := ts.post(t, "/v1/take", `{"bucket":"booking_com"}`, &d, "Authorization", "Bearer tok"); code != 200 || !d.Allowed {
		t.Errorf("good token: %d %+v", code, d)
	}
	if code, _ := ts.get(t, "/healthz"); code != 200 {
		t.Errorf("/healthz needs no token, got %d", code)
	}
	if code, body := ts.get(t, "/v1/take"); code != http.StatusMethodNotAllowed || !strings.Contains(body, wire.CodeMethod) {
		t.Errorf("GET /v1/take: %d %s", code, body)
	}
	if code, body := ts.get(t, "/nope"); code != http.StatusNotFound || !strings.Contains(body, wire.CodeNotFound) {
		t.Errorf("GET /nope: %d %s", code, body)
	}
}

func TestConfigEndpointAndStoreAPI(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig)
	code, body := ts.get(t, "/v1/config")
	var v configView
	if err := json.Unmarshal([]byte(body), &v); err != nil || code != 200 {
		t.Fatalf("/v1/config: %d %s %v", code, body, err)
	}
	if len(v.Domains) != 1 || v.Domains[0].Name != "edge" || len(v.Buckets) != 3 || v.Buckets[0].Key != "fleetrate:{booking_com}/availability" {
		t.Errorf("/v1/config = %+v", v)
	}
	var res wire.Result
	req := wire.TakeRequest{Buckets: []wire.Bucket{{Prefix: "fleetrate:", Key: "raw", Limits: []wire.Limit{{Rate: 1, Burst: 2}}}}, N: 2}
	if code := ts.post(t, wire.TakePath, req, &res); code != 200 || !res.Allowed || res.Remaining != 0 {
		t.Errorf("store take: %d %+v", code, res)
	}
	// The raw API cannot reach keys outside the service's prefix, such as
	// another application's keys in the same Redis.
	foreign := []wire.Bucket{{Key: "app:session:42", Limits: []wire.Limit{{Rate: 1, Burst: 2}}}}
	for path, body := range map[string]any{
		wire.TakePath:   wire.TakeRequest{Buckets: foreign, N: 1},
		wire.RefundPath: wire.RefundRequest{Buckets: foreign, N: 1},
		wire.DrainPath:  wire.DrainRequest{Buckets: foreign, DurationNS: 1},
		wire.ResetPath:  wire.ResetRequest{Keys: []wire.Bytes{"app:session:42"}},
	} {
		var e wire.Error
		if code := ts.post(t, path, body, &e); code != http.StatusBadRequest || e.Code != wire.CodeInvalid || !strings.Contains(e.Error, `"app:session:42"`) {
			t.Errorf("%s with a foreign key: %d %+v", path, code, e)
		}
	}
	off := start(t, bucketConfig, func(o *Options) { o.DisableStoreAPI = true })
	var e wire.Error
	if code := off.post(t, wire.TakePath, req, &e); code != http.StatusForbidden || e.Code != wire.CodeDisabled {
		t.Errorf("disabled store API: %d %+v", code, e)
	}
}

// TestTakeAndWaitWithReserve: a take of a lower priority class leaves the
// reserve it names in every bucket, for the callers that send none.
func TestTakeAndWaitWithReserve(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig)
	var d Decision
	for i := int64(59); i >= 58; i-- { // 60/min, burst 60: keep 58
		if code := ts.post(t, "/v1/take", map[string]any{"bucket": "expedia/search", "reserve": 58}, &d); code != 200 || !d.Allowed || d.Remaining != i {
			t.Fatalf("low take: %d %+v, want allowed with %d left", code, d, i)
		}
	}
	if code := ts.post(t, "/v1/take", map[string]any{"bucket": "expedia/search", "reserve": 58}, &d); code != 200 || d.Allowed || d.RetryAfterMS != 1000 {
		t.Fatalf("low take into the reserve: %d %+v, want denied, retry after 1000ms", code, d)
	}
	if code := ts.post(t, "/v1/wait", map[string]any{"bucket": "expedia/search", "reserve": 58, "max_wait_ms": 1500}, &d); code != 200 || !d.Allowed || d.WaitMS != 1000 {
		t.Fatalf("low wait: %d %+v, want booked 1000ms ahead, within its horizon", code, d)
	}
	if code := ts.post(t, "/v1/take", map[string]any{"bucket": "expedia/search"}, &d); code != 200 || !d.Allowed {
		t.Fatalf("top take: %d %+v, want allowed from the reserve", code, d)
	}
	var e wire.Error
	if code := ts.post(t, "/v1/take", map[string]any{"bucket": "expedia/search", "reserve": 60}, &e); code != 400 || !strings.Contains(e.Error, "reserve") {
		t.Fatalf("a reserve of the whole burst: %d %+v, want 400 naming the reserve", code, e)
	}
}

// TestWaitThenCancel books two slots ahead with /v1/wait, gives the latest
// back with /v1/cancel (its decision's n and booking), and books again:
// the next booking gets the cancelled slot. The earlier one, which a
// later booking relies on, gives nothing back.
func TestWaitThenCancel(t *testing.T) {
	t.Parallel()
	ts := start(t, bucketConfig)
	const b = "booking_com/availability" // 10/s burst 2
	var d Decision
	ts.post(t, "/v1/take", map[string]any{"bucket": b, "n": 2}, &d)
	var first, second Decision
	ts.post(t, "/v1/wait", map[string]any{"bucket": b, "max_wait_ms": 1000}, &first)
	ts.post(t, "/v1/wait", map[string]any{"bucket": b, "max_wait_ms": 1000}, &second)
	if !second.Allowed || second.WaitMS != 200 || second.Booking == nil || len(second.Booking.DebtsNS) != 1 {
		t.Fatalf("second booking: %+v", second)
	}
	var done Done
	if code := ts.post(t, "/v1/cancel", map[string]any{"bucket": b, "booking": first.Booking}, &done); code != 200 || !done.OK {
		t.Fatalf("cancel of the first: %d %+v", code, done)
	}
	if code := ts.post(t, "/v1/cancel", map[string]any{"bucket": b, "booking": second.Booking}, &done); code != 200 || !done.OK {
		t.Fatalf("cancel of the second: %d %+v", code, done)
	}
	var next Decision
	ts.post(t, "/v1/wait", map[string]any{"bucket": b, "max_wait_ms": 1000}, &next)
	if next.WaitMS != 200 {
		t.Fatalf("after cancelling the latest booking (200 ms) the next waits %v ms, want 200 (the first, relied on, kept its tokens)", next.WaitMS)
	}
	if code := ts.post(t, "/v1/cancel", map[string]any{"bucket": b}, &done); code != 400 {
		t.Fatalf("cancel without a booking: %d, want 400", code)
	}
}
