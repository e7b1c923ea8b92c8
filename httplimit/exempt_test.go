package httplimit

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// serverGet sends n GETs to path on srv with an API key and returns the
// status codes and the last response.
func serverGet(t *testing.T, srv *httptest.Server, path, apiKey string, n int) ([]int, *http.Response, string) {
	t.Helper()
	var codes []int
	var last *http.Response
	var body string
	for range n {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("X-API-Key", apiKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		last, body = resp, string(b)
	}
	return codes, last, body
}

func count(codes []int, code int) int {
	n := 0
	for _, c := range codes {
		if c == code {
			n++
		}
	}
	return n
}

// TestExemptions checks, through a real server, that exempt keys, peers and
// routes are never limited nor given RateLimit fields, are counted as
// "exempt", and that everyone else still is limited.
func TestExemptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		exempt Exemptions
		key    string
		path   string
		want   bool
	}{
		{"exempt key", Exemptions{Keys: []string{"apikey:" + HashKey("sk_internal")}}, "sk_internal", "/", true},
		{"other key", Exemptions{Keys: []string{"apikey:" + HashKey("sk_internal")}}, "sk_customer", "/", false},
		{"exempt peer network", Exemptions{Peers: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, "k", "/", true},
		{"peer outside the network", Exemptions{Peers: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, "k", "/", false},
		{"exempt route", Exemptions{Func: func(r *http.Request) bool { return r.URL.Path == "/healthz" }}, "k", "/healthz", true},
		{"other route", Exemptions{Func: func(r *http.Request) bool { return r.URL.Path == "/healthz" }}, "k", "/v1", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			cfg := memConfig(newClock())
			cfg.Exempt, cfg.Registerer = tt.exempt, reg
			srv := httptest.NewServer(limited(t, cfg, messagesPolicy(), &okHandler{}))
			t.Cleanup(srv.Close)
			codes, last, _ := serverGet(t, srv, tt.path, tt.key, 25)
			exempt := counter(t, reg, "fleetrate_http_requests_total", map[string]string{"policy": "messages", "outcome": OutcomeExempt})
			if tt.want {
				if count(codes, http.StatusOK) != 25 || last.Header.Get(HeaderRateLimit) != "" || exempt != 25 {
					t.Errorf("exempt: %d of 25 admitted, RateLimit %q, %v counted exempt; want 25, none, 25",
						count(codes, http.StatusOK), last.Header.Get(HeaderRateLimit), exempt)
				}
				return
			}
			if count(codes, http.StatusOK) != 20 || exempt != 0 {
				t.Errorf("not exempt: %d of 25 admitted, %v counted exempt; want the burst of 20 and 0", count(codes, http.StatusOK), exempt)
			}
		})
	}
	if err := (Config{Store: memConfig(newClock()).Store, Exempt: Exemptions{Peers: []netip.Prefix{{}}}}).Validate(); err == nil || !strings.Contains(err.Error(), "exempt peers[0]") {
		t.Errorf("invalid exempt prefix: %v", err)
	}
}

// TestCustomResponses renders refusals and store failures with the
// Refused and Unavailable options, through a real server: the RateLimit
// fields are set before they are called, and the decision is at hand.
func TestCustomResponses(t *testing.T) {
	t.Parallel()
	cfg := memConfig(newClock())
	var got Refusal
	cfg.Refused = func(w http.ResponseWriter, _ *http.Request, ref Refusal) {
		got = ref
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ref.Status)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": "slow_down", "policy": ref.Policy, "retry_ms": ref.RetryAfter.Milliseconds()})
	}
	srv := httptest.NewServer(limited(t, cfg, messagesPolicy(), &okHandler{}))
	t.Cleanup(srv.Close)
	codes, last, body := serverGet(t, srv, "/", "k", 21)
	if codes[20] != http.StatusTooManyRequests {
		t.Fatalf("21st request: %d, want 429", codes[20])
	}
	if want := `{"error":"slow_down","policy":"messages","retry_ms":100}` + "\n"; body != want {
		t.Errorf("body %q, want %q", body, want)
	}
	if last.Header.Get(HeaderRetryAfter) != "1" || last.Header.Get(HeaderRateLimit) != `"messages";r=0;t=0` {
		t.Errorf("Retry-After %q, RateLimit %q: the headers must be set before Refused", last.Header.Get(HeaderRetryAfter), last.Header.Get(HeaderRateLimit))
	}
	if got.Result.Allowed || got.Cost != 1 || got.Problem.Type != ProblemQuotaExceeded {
		t.Errorf("refusal %+v: want the decision and the default problem", got)
	}

	cfg = memConfig(newClock())
	cfg.Store, cfg.FailClosed = &failingStore{}, true
	cfg.Unavailable = func(w http.ResponseWriter, _ *http.Request, err error) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = fmt.Fprintf(w, "busy (%v)", err != nil)
	}
	srv2 := httptest.NewServer(limited(t, cfg, messagesPolicy(), &okHandler{}))
	t.Cleanup(srv2.Close)
	codes, last, body = serverGet(t, srv2, "/", "k", 1)
	if codes[0] != http.StatusServiceUnavailable || body != "busy (true)" || last.Header.Get(HeaderRetryAfter) != "1" {
		t.Errorf("store down: %d %q Retry-After %q; want 503 \"busy (true)\" 1", codes[0], body, last.Header.Get(HeaderRetryAfter))
	}
}
