package httplimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/memstore"
)

func mustPeriod(t testing.TB, s string) calendar.Period {
	t.Helper()
	p, err := calendar.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPolicyQuotasAreValidated(t *testing.T) {
	t.Parallel()
	day := calendar.Period{Unit: calendar.Day}
	minute := []fleetrate.Limit{fleetrate.PerPeriod(10, time.Minute)}
	tests := []struct {
		name string
		p    Policy
		want string
	}{
		{"count 0", Policy{Name: "api", Limits: minute, Quotas: []fleetrate.Quota{{Count: 0, Period: day}}}, "quotas[0]: fleetrate: invalid: quota \"day\" count"},
		{"no period", Policy{Name: "api", Limits: minute, Quotas: []fleetrate.Quota{{Count: 5}}}, "quotas[0]"},
		{"anchor day 32", Policy{Name: "api", Limits: minute, Quotas: []fleetrate.Quota{{Count: 5, Period: calendar.Period{Unit: calendar.Month, Day: 32}}}}, "quotas[0]: fleetrate: invalid: quota \"month day=32\" period"},
		{"bad name", Policy{Name: "api", Limits: minute, Quotas: []fleetrate.Quota{{Name: "a b", Count: 5, Period: day}}}, "quotas[0].name"},
		{"same item twice", Policy{Name: "api", Limits: minute, Quotas: []fleetrate.Quota{{Count: 5, Period: day}, {Count: 5, Period: mustPeriod(t, "day Asia/Tokyo")}}}, "quotas[0] and quotas[1] are both named \"api.day\""},
		{"a limit's name", Policy{Name: "api", Limits: []fleetrate.Limit{minute[0].Named("day"), fleetrate.PerSecond(1, 1).Named("s")}, Quotas: []fleetrate.Quota{{Count: 5, Period: day}}}, "limits[0] and quotas[0]"},
		{"count too large for the headers", Policy{Name: "api", Limits: minute, Unit: headers.UnitContentBytes, UnitsPerToken: 1 << 20, Quotas: []fleetrate.Quota{{Count: 1 << 40, Period: day}}}, "quotas[0].count"},
		{"quotas without limits", Policy{Name: "api", Tiers: []Tier{{Name: "free", Limits: minute}}, Tier: func(*http.Request) (string, error) { return "free", nil }, Quotas: []fleetrate.Quota{{Count: 5, Period: day}}}, "quotas need limits"},
		{"a tier's count 0", Policy{Name: "api", Tiers: []Tier{{Name: "free", Limits: minute, Quotas: []fleetrate.Quota{{Period: day}}}}, Tier: func(*http.Request) (string, error) { return "free", nil }}, "tiers[0]: fleetrate: invalid: httplimit: policy \"api.free\": quotas[0]"},
	}
	m, err := New(Config{Store: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		_, err := m.Limit(tt.p)
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Limit = %v, want an error containing %q", tt.name, err, tt.want)
		}
		if _, err := m.UsageHandler(tt.p); err == nil {
			t.Errorf("%s: UsageHandler accepted the policy", tt.name)
		}
	}
}

// quotaPolicy is a plan of 3 a day in Tokyo, smoothed by 100 a second.
func quotaPolicy(t testing.TB) Policy {
	return Policy{
		Name:   "api",
		Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 100)},
		Quotas: []fleetrate.Quota{{Count: 3, Period: mustPeriod(t, "day Asia/Tokyo")}},
	}
}

// TestQuotaRefusalStatesTheReset walks a client through its day: the
// headers report the quota as it runs down, a refusal carries the
// window's exact end in Retry-After, RateLimit and X-RateLimit-Reset, and
// the client is admitted at that end and not a microsecond before.
func TestQuotaRefusalStatesTheReset(t *testing.T) {
	t.Parallel()
	// 14:59:58.5 UTC: 23:59:58.5 in Tokyo, 1.5 s before its midnight.
	clock := manualclock.New(time.Date(2026, 3, 2, 14, 59, 58, 500_000_000, time.UTC))
	end := time.Date(2026, 3, 2, 15, 0, 0, 0, time.UTC)
	cfg := memConfig(clock)
	cfg.LegacyHeaders = true
	h := limited(t, cfg, quotaPolicy(t), &okHandler{})

	w := do(h, "k")
	if got := w.Header().Get(HeaderRateLimitPolicy); got != `"api";q=100;w=1, "api.day";q=3` {
		t.Errorf("RateLimit-Policy = %q", got)
	}
	for want := int64(2); want >= 0; want-- {
		if want < 2 {
			w = do(h, "k")
		}
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", 3-want, w.Code)
		}
		if l := rateLimit(t, w); l.Name != "api.day" || l.Remaining != want || l.Reset != time.Second {
			t.Errorf("request %d: RateLimit %+v, want api.day r=%d t=1", 3-want, l, want)
		}
	}
	w = do(h, "k")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("4th request: status %d, want 429", w.Code)
	}
	if l := rateLimit(t, w); l.Name != "api.day" || l.Remaining != 0 || l.Reset != time.Second {
		t.Errorf("429: RateLimit %+v, want api.day r=0 t=1", l)
	}
	for field, want := range map[string]string{
		HeaderRetryAfter:          "2", // 1.5 s, rounded up
		HeaderXRateLimitLimit:     "3",
		HeaderXRateLimitRemaining: "0",
		HeaderXRateLimitReset:     strconv.FormatInt(end.Unix(), 10),
	} {
		if got := w.Header().Get(field); got != want {
			t.Errorf("429: %s = %q, want %q", field, got, want)
		}
	}
	p := decodeProblem(t, w)
	if p.Type != ProblemQuotaExceeded || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "api.day" || !strings.Contains(p.Detail, "2026-03-02T15:00:00Z") {
		t.Errorf("problem %+v", p)
	}
	clock.Advance(end.Sub(clock.Now()) - time.Microsecond)
	if w := do(h, "k"); w.Code != http.StatusTooManyRequests {
		t.Errorf("a microsecond before the reset: status %d, want 429", w.Code)
	}
	clock.Advance(time.Microsecond)
	w = do(h, "k")
	if l := rateLimit(t, w); w.Code != http.StatusOK || l.Name != "api.day" || l.Remaining != 2 || l.Reset != 24*time.Hour {
		t.Errorf("at the reset: status %d, RateLimit %+v; want 200 api.day r=2 t=86400", w.Code, l)
	}
	if got := w.Header().Get(HeaderXRateLimitReset); got != strconv.FormatInt(end.Add(24*time.Hour).Unix(), 10) {
		t.Errorf("at the reset: X-RateLimit-Reset %s", got)
	}
}

// TestQuotaCostAboveCount refuses a request that costs more than the
// quota admits in a window as one above a burst: never, without
// Retry-After, and without failing open on the store's refusal.
func TestQuotaCostAboveCount(t *testing.T) {
	t.Parallel()
	p := quotaPolicy(t)
	p.Cost = Weight(4)
	next := &okHandler{}
	h := limited(t, memConfig(newClock()), p, next)
	w := do(h, "k")
	if w.Code != http.StatusTooManyRequests || w.Header().Get(HeaderRetryAfter) != "" || next.count() != 0 {
		t.Fatalf("status %d, Retry-After %q, handler calls %d; want 429 without Retry-After", w.Code, w.Header().Get(HeaderRetryAfter), next.count())
	}
	if pr := decodeProblem(t, w); len(pr.ViolatedPolicies) != 1 || pr.ViolatedPolicies[0] != "api.day" {
		t.Errorf("problem %+v, want api.day violated", pr)
	}
}

// TestPlanTiers serves a free and a pro plan as tiers of one policy: each
// has its own quota and header items.
func TestPlanTiers(t *testing.T) {
	t.Parallel()
	minute := []fleetrate.Limit{fleetrate.PerPeriod(60, time.Minute)}
	p := Policy{
		Name: "api",
		Tiers: []Tier{
			{Name: "free", Limits: minute, Quotas: []fleetrate.Quota{{Count: 2, Period: mustPeriod(t, "day")}}},
			{Name: "pro", Limits: minute, Quotas: []fleetrate.Quota{{Count: 10_000, Period: mustPeriod(t, "month day=1")}}},
		},
		Tier: func(r *http.Request) (string, error) { return r.Header.Get("X-Plan"), nil },
	}
	h := limited(t, memConfig(newClock()), p, &okHandler{})
	send := func(plan string) *http.Response {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-API-Key", "k")
		r.Header.Set("X-Plan", plan)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	}
	for i, want := range []int{200, 200, 429} {
		if res := send("free"); res.StatusCode != want {
			t.Errorf("free request %d: %d, want %d", i+1, res.StatusCode, want)
		}
	}
	res := send("pro")
	ls, err := headers.ParseRateLimit(res.Header.Values(HeaderRateLimit)...)
	if res.StatusCode != 200 || err != nil || ls[0].Name != "api.pro" {
		t.Errorf("pro: %d, RateLimit %v (%v); want 200 reporting the per-minute bucket", res.StatusCode, ls, err)
	}
}

// TestQuotaZone gives each client a day that starts at its own midnight.
func TestQuotaZone(t *testing.T) {
	t.Parallel()
	clock := manualclock.New(time.Date(2026, 3, 2, 14, 59, 59, 0, time.UTC)) // 23:59:59 in Tokyo, 09:59:59 in New York
	zoneOf := map[string]string{"tokyo": "Asia/Tokyo", "ny": "America/New_York", "utc": "", "mars": "Mars/Olympus_Mons"}
	p := Policy{
		Name:      "api",
		Limits:    []fleetrate.Limit{fleetrate.PerSecond(100, 100)},
		Quotas:    []fleetrate.Quota{{Count: 2, Period: calendar.Period{Unit: calendar.Day}}},
		QuotaZone: func(r *http.Request) (string, error) { return zoneOf[r.Header.Get("X-API-Key")], nil },
	}
	m, err := New(memConfig(clock))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := m.Limit(p)
	if err != nil {
		t.Fatal(err)
	}
	h := mw(&okHandler{})
	for _, key := range []string{"tokyo", "ny", "utc"} {
		for range 2 {
			if w := do(h, key); w.Code != http.StatusOK {
				t.Fatalf("%s: %d", key, w.Code)
			}
		}
	}
	clock.Advance(time.Second)
	if w := do(h, "tokyo"); w.Code != http.StatusOK || rateLimit(t, w).Remaining != 1 {
		t.Errorf("tokyo after its midnight: %d %q, want 200 r=1", w.Code, w.Header().Get(HeaderRateLimit))
	}
	// New York's midnight is 05:00 UTC (EST), 14 h later; UTC's 9 h.
	for key, retry := range map[string]string{"ny": "50400", "utc": "32400"} {
		if w := do(h, key); w.Code != http.StatusTooManyRequests || w.Header().Get(HeaderRetryAfter) != retry {
			t.Errorf("%s: %d, Retry-After %q; want 429 and %s", key, w.Code, w.Header().Get(HeaderRetryAfter), retry)
		}
	}
	if w := do(h, "mars"); w.Code != http.StatusBadRequest {
		t.Errorf("an unknown zone: %d, want 400", w.Code)
	}
	usage, err := m.UsageHandler(p)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/usage", nil)
	r.Header.Set("X-API-Key", "tokyo")
	w := httptest.NewRecorder()
	usage.ServeHTTP(w, r)
	if !strings.Contains(w.Body.String(), `"period":"day Asia/Tokyo","count":2,"used":1`) {
		t.Errorf("tokyo's usage: %s", w.Body)
	}
}
