package httplimit

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/memstore"
)

// usageServer serves POST /v1/messages behind p and GET /v1/usage, over
// a real listener.
func usageServer(t *testing.T, cfg Config, p Policy) *httptest.Server {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	limit, err := m.Limit(p)
	if err != nil {
		t.Fatal(err)
	}
	usage, err := m.UsageHandler(p)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/messages", limit(&okHandler{}))
	mux.Handle("/v1/usage", usage)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func call(t *testing.T, srv *httptest.Server, method, path, key string) (*http.Response, []byte) {
	t.Helper()
	r, err := http.NewRequest(method, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		r.Header.Set("X-API-Key", key)
	}
	res, err := srv.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, body
}

func usageOf(t *testing.T, srv *httptest.Server, key string) UsageReport {
	t.Helper()
	res, body := call(t, srv, http.MethodGet, "/v1/usage", key)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("usage: %d %s %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	var u UsageReport
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&u); err != nil {
		t.Fatalf("usage body %s: %v", body, err)
	}
	return u
}

func TestUsageHandler(t *testing.T) {
	t.Parallel()
	clock := manualclock.New(time.Date(2026, 3, 14, 9, 30, 0, 0, time.UTC))
	p := Policy{
		Name:   "api",
		Limits: []fleetrate.Limit{fleetrate.PerPeriod(20, time.Minute).Named("minute")},
		Quotas: []fleetrate.Quota{{Name: "month", Count: 1000, Period: mustPeriod(t, "month day=1 Europe/Paris")}},
	}
	srv := usageServer(t, memConfig(clock), p)
	reset := time.Date(2026, 3, 31, 22, 0, 0, 0, time.UTC) // April 1st in Paris (CEST)

	t.Run("a client that never called has everything", func(t *testing.T) {
		u := usageOf(t, srv, "new")
		want := UsageReport{
			Policy: "api", Unit: "requests", At: clock.Now(), Available: 20,
			Limit:  UsageLimit{Name: "api.minute", Burst: 20, Used: 0, Remaining: 20, Reset: clock.Now()},
			Quotas: []UsageQuota{{Name: "api.month", Period: "month Europe/Paris", Count: 1000, Used: 0, Remaining: 1000, Reset: reset}},
		}
		if !equalReports(u, want) {
			t.Errorf("usage\n got %+v\nwant %+v", u, want)
		}
	})
	t.Run("usage counts what was granted", func(t *testing.T) {
		for range 5 {
			if res, body := call(t, srv, http.MethodPost, "/v1/messages", "busy"); res.StatusCode != http.StatusOK {
				t.Fatalf("POST: %d %s", res.StatusCode, body)
			}
		}
		u := usageOf(t, srv, "busy")
		if u.Available != 15 || u.Limit.Used != 5 || u.Limit.Remaining != 15 || !u.Limit.Reset.Equal(clock.Now().Add(15*time.Second)) {
			t.Errorf("limit %+v, available %d; want 5 used, full in 15 s", u.Limit, u.Available)
		}
		if q := u.Quotas[0]; q.Used != 5 || q.Remaining != 995 || !q.Reset.Equal(reset) {
			t.Errorf("quota %+v; want 5 used, reset %v", q, reset)
		}
		// The usage read took nothing.
		if again := usageOf(t, srv, "busy"); again.Quotas[0].Used != 5 || again.Limit.Used != 5 {
			t.Errorf("a second read: %+v", again)
		}
	})
	t.Run("other methods are refused", func(t *testing.T) {
		res, _ := call(t, srv, http.MethodPost, "/v1/usage", "k")
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST /v1/usage: %d, Allow %q", res.StatusCode, res.Header.Get("Allow"))
		}
	})
	t.Run("a client without a key is a bad request", func(t *testing.T) {
		res, body := call(t, srv, http.MethodGet, "/v1/usage", "")
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "cannot identify the client") {
			t.Errorf("no key: %d %s", res.StatusCode, body)
		}
	})
}

// TestUsageHandlerStoreDown answers 503 with a problem, never a usage,
// when the store fails.
func TestUsageHandlerStoreDown(t *testing.T) {
	t.Parallel()
	p := Policy{
		Name:   "api",
		Limits: []fleetrate.Limit{fleetrate.PerPeriod(20, time.Minute)},
		Quotas: []fleetrate.Quota{{Count: 1000, Period: mustPeriod(t, "month")}},
	}
	srv := usageServer(t, Config{Store: &failingStore{}, Key: APIKey("X-API-Key"), Logger: slog.New(slog.DiscardHandler)}, p)
	res, body := call(t, srv, http.MethodGet, "/v1/usage", "k")
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Content-Type") != ProblemContentType || res.Header.Get(HeaderRetryAfter) != "1" {
		t.Fatalf("store down: %d %q Retry-After %q", res.StatusCode, res.Header.Get("Content-Type"), res.Header.Get(HeaderRetryAfter))
	}
	var pr map[string]any
	if err := json.Unmarshal(body, &pr); err != nil || pr["status"] != float64(503) || pr["detail"] == nil || pr["quotas"] != nil || pr["available"] != nil {
		t.Errorf("store down: body %s (%v); want a problem and no usage", body, err)
	}
}

// TestUsageHandlerTiers reads the usage of the calling client's tier.
func TestUsageHandlerTiers(t *testing.T) {
	t.Parallel()
	minute := []fleetrate.Limit{fleetrate.PerPeriod(60, time.Minute)}
	p := Policy{
		Name: "api",
		Tiers: []Tier{
			{Name: "free", Limits: minute, Quotas: []fleetrate.Quota{{Count: 100, Period: mustPeriod(t, "day Asia/Tokyo")}}},
			{Name: "pro", Limits: minute, Quotas: []fleetrate.Quota{{Count: 10_000, Period: mustPeriod(t, "month")}}},
		},
		Tier: func(r *http.Request) (string, error) {
			if strings.HasPrefix(r.Header.Get("X-API-Key"), "pro-") {
				return "pro", nil
			}
			return "free", nil
		},
	}
	srv := usageServer(t, Config{Store: memstore.New(memstore.Options{}), Key: APIKey("X-API-Key")}, p)
	call(t, srv, http.MethodPost, "/v1/messages", "pro-1")
	if u := usageOf(t, srv, "pro-1"); u.Policy != "api.pro" || len(u.Quotas) != 1 || u.Quotas[0].Name != "api.pro.month" || u.Quotas[0].Used != 1 {
		t.Errorf("pro: %+v", u)
	}
	if u := usageOf(t, srv, "free-1"); u.Policy != "api.free" || u.Quotas[0].Count != 100 || u.Quotas[0].Used != 0 {
		t.Errorf("free: %+v", u)
	}
}

func equalReports(a, b UsageReport) bool {
	if a.Policy != b.Policy || a.Unit != b.Unit || !a.At.Equal(b.At) || a.Available != b.Available || len(a.Quotas) != len(b.Quotas) {
		return false
	}
	la, lb := a.Limit, b.Limit
	if la.Name != lb.Name || la.Burst != lb.Burst || la.Used != lb.Used || la.Remaining != lb.Remaining || !la.Reset.Equal(lb.Reset) {
		return false
	}
	for i, qa := range a.Quotas {
		qb := b.Quotas[i]
		if qa.Name != qb.Name || qa.Period != qb.Period || qa.Count != qb.Count || qa.Used != qb.Used || qa.Remaining != qb.Remaining || !qa.Reset.Equal(qb.Reset) {
			return false
		}
	}
	return true
}
