package mockota_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
)

func newOTA(t *testing.T, cfg mockota.Config) (*mockota.OTA, *manualclock.Clock) {
	t.Helper()
	c := manualclock.New(time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC))
	cfg.Now = c.Now
	o, err := mockota.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o, c
}

// call sends one request and returns the status, Retry-After and reason.
func call(o http.Handler, method, path string) (int, string, string) {
	rec := httptest.NewRecorder()
	o.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get(mockota.HeaderReason)
}

func TestDocumentedLimitIsASlidingWindow(t *testing.T) {
	t.Parallel()
	o, c := newOTA(t, mockota.Config{Endpoints: []mockota.Endpoint{{Name: "avail", Pattern: "POST /avail", Limit: 3}}})
	// Three requests spread over the first 600ms are accepted.
	for i := range 3 {
		if code, _, _ := call(o, "POST", "/avail"); code != 200 {
			t.Fatalf("request %d: status %d, want 200", i, code)
		}
		c.Advance(300 * time.Millisecond)
	}
	// At 900ms the window (−100ms, 900ms] holds three: rejected, and the
	// oldest (at 0) leaves at 1s, so Retry-After is 1 (rounded up).
	code, ra, reason := call(o, "POST", "/avail")
	if code != 429 || ra != "1" || reason != mockota.ReasonDocumented {
		t.Fatalf("4th request: %d Retry-After %q reason %q; want 429, 1, documented", code, ra, reason)
	}
	// At exactly 1s the first request has left the window (t-1s, t].
	c.Advance(100 * time.Millisecond)
	if code, _, _ := call(o, "POST", "/avail"); code != 200 {
		t.Fatalf("at 1s: status %d, want 200", code)
	}
	if code, _, _ := call(o, "POST", "/avail"); code != 429 {
		t.Fatalf("second request at 1s: status %d, want 429", code)
	}
	s := o.Stats()["avail"]
	want := mockota.Stats{Requests: 6, Accepted: 4, Documented: 2, Peak: 3}
	if s != want {
		t.Errorf("stats = %+v, want %+v", s, want)
	}
	if s.Limited() != 2 {
		t.Errorf("Limited() = %d, want 2", s.Limited())
	}
}

func TestCredentialLimitSpansEndpoints(t *testing.T) {
	t.Parallel()
	o, c := newOTA(t, mockota.Config{
		Endpoints: []mockota.Endpoint{
			{Name: "a", Pattern: "/a", Limit: 5},
			{Name: "b", Pattern: "/b", Limit: 5},
		},
		Credential: 3,
	})
	for _, p := range []string{"/a", "/b", "/a"} {
		if code, _, _ := call(o, "GET", p); code != 200 {
			t.Fatalf("%s: status %d, want 200", p, code)
		}
	}
	c.Advance(400 * time.Millisecond)
	code, ra, reason := call(o, "GET", "/b")
	if code != 429 || ra != "1" || reason != mockota.ReasonDocumented {
		t.Errorf("4th over the credential: %d %q %q; want 429, 1, documented", code, ra, reason)
	}
	if o.CredentialPeak() != 3 {
		t.Errorf("CredentialPeak() = %d, want 3", o.CredentialPeak())
	}
	if d := o.Describe(); d != "a 5/s, b 5/s, credential 3/s" {
		t.Errorf("Describe() = %q", d)
	}
}

func TestHiddenLimitPerKey(t *testing.T) {
	t.Parallel()
	o, c := newOTA(t, mockota.Config{
		Endpoints: []mockota.Endpoint{{Name: "rates", Pattern: "POST /hotels/{hotel}/rates", Limit: 10}},
		Hidden:    &mockota.Hidden{Endpoint: "rates", Key: "hotel", Limit: 2, RetryAfter: 1500 * time.Millisecond},
	})
	for range 2 {
		if code, _, _ := call(o, "POST", "/hotels/7/rates"); code != 200 {
			t.Fatalf("status %d, want 200", code)
		}
	}
	code, ra, reason := call(o, "POST", "/hotels/7/rates")
	if code != 429 || ra != "2" || reason != mockota.ReasonHidden {
		t.Errorf("3rd for hotel 7: %d %q %q; want 429, 2 (1.5s rounded up), hidden", code, ra, reason)
	}
	if code, _, _ := call(o, "POST", "/hotels/8/rates"); code != 200 {
		t.Errorf("hotel 8: status %d, want 200 (its own hidden window)", code)
	}
	c.Advance(time.Second)
	if code, _, _ := call(o, "POST", "/hotels/7/rates"); code != 200 {
		t.Errorf("hotel 7 a second later: status %d, want 200", code)
	}
	s := o.Stats()["rates"]
	if s.Hidden != 1 || s.Documented != 0 || s.Accepted != 4 {
		t.Errorf("stats = %+v, want 1 hidden, 0 documented, 4 accepted", s)
	}
	arr := o.Arrivals("rates")
	if len(arr) != 5 || arr[2].Status != 429 || arr[2].Reason != mockota.ReasonHidden || arr[2].Key != "7" {
		t.Errorf("arrivals = %+v", arr)
	}
}

func TestInject(t *testing.T) {
	t.Parallel()
	o, _ := newOTA(t, mockota.Demo())
	if err := o.Inject("availability", 429, "2"); err != nil {
		t.Fatal(err)
	}
	if err := o.Inject("availability", 503, ""); err != nil {
		t.Fatal(err)
	}
	path := "/v1/hotels/1/availability"
	for _, want := range []struct {
		code int
		ra   string
	}{{429, "2"}, {503, ""}, {200, ""}} {
		code, ra, _ := call(o, "POST", path)
		if code != want.code || ra != want.ra {
			t.Errorf("got %d %q, want %d %q", code, ra, want.code, want.ra)
		}
	}
	if s := o.Stats()["availability"]; s.Injected != 2 || s.Accepted != 1 {
		t.Errorf("stats = %+v, want 2 injected, 1 accepted", s)
	}
	if err := o.Inject("nope", 429, ""); err == nil || !strings.Contains(err.Error(), `unknown endpoint "nope"`) {
		t.Errorf("Inject(unknown) = %v", err)
	}
	if err := o.Inject("rates", 42, ""); err == nil || !strings.Contains(err.Error(), "got 42") {
		t.Errorf("Inject(status 42) = %v", err)
	}
}

func TestUnknownPathIs404(t *testing.T) {
	t.Parallel()
	o, _ := newOTA(t, mockota.Demo())
	if code, _, _ := call(o, "GET", "/v1/nothing"); code != 404 {
		t.Errorf("status %d, want 404", code)
	}
	if code, _, _ := call(o, "GET", "/v1/hotels/1/availability"); code != 405 {
		t.Errorf("wrong method: status %d, want 405", code)
	}
	if len(o.Arrivals()) != 0 {
		t.Errorf("unmatched requests were counted: %+v", o.Arrivals())
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ep := []mockota.Endpoint{{Name: "a", Pattern: "/a", Limit: 1}}
	tests := []struct {
		name string
		cfg  mockota.Config
		want string
	}{
		{"no endpoints", mockota.Config{}, "endpoints: at least one is required"},
		{"empty name", mockota.Config{Endpoints: []mockota.Endpoint{{Pattern: "/a"}}}, "endpoints[0].name"},
		{"duplicate", mockota.Config{Endpoints: []mockota.Endpoint{{Name: "a", Pattern: "/a"}, {Name: "a", Pattern: "/b"}}}, `endpoints[1].name: duplicate "a"`},
		{"no pattern", mockota.Config{Endpoints: []mockota.Endpoint{{Name: "a"}}}, "endpoints[0].pattern"},
		{"negative limit", mockota.Config{Endpoints: []mockota.Endpoint{{Name: "a", Pattern: "/a", Limit: -1}}}, "endpoints[0].limit: must be >= 0, got -1"},
		{"negative credential", mockota.Config{Endpoints: ep, Credential: -1}, "credential: must be >= 0"},
		{"negative window", mockota.Config{Endpoints: ep, Window: -1}, "window: must be >= 0"},
		{"hidden unknown endpoint", mockota.Config{Endpoints: ep, Hidden: &mockota.Hidden{Endpoint: "z", Limit: 1}}, `hidden.endpoint: unknown endpoint "z"`},
		{"hidden zero limit", mockota.Config{Endpoints: ep, Hidden: &mockota.Hidden{Endpoint: "a"}}, "hidden.limit: must be >= 1, got 0"},
		{"bad pattern", mockota.Config{Endpoints: []mockota.Endpoint{{Name: "a", Pattern: "GET /{"}}}, "endpoints[0].pattern"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := mockota.New(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New() = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	o, err := mockota.New(mockota.Demo())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(o)
	defer srv.Close()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				resp, err := srv.Client().Post(srv.URL+"/v1/hotels/1/availability", "application/json", nil)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	s := o.Stats()["availability"]
	if s.Requests != 160 || s.Accepted+s.Limited() != 160 || s.Peak > 20 {
		t.Errorf("stats = %+v: want 160 requests, all answered, peak <= 20", s)
	}
}
