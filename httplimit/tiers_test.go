package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate"
)

// planKey is the context key of the plan an auth middleware found.
type planKey struct{}

// withPlan stands for an auth middleware: it reads the caller's plan from
// a header (in real life, from the API key's account).
func withPlan(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), planKey{}, r.Header.Get("X-Plan"))))
	})
}

func planOf(r *http.Request) (string, error) {
	plan, _ := r.Context().Value(planKey{}).(string)
	return plan, nil
}

func tieredPolicy() Policy {
	return Policy{
		Name:   "api",
		Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}, // no plan
		Tiers: []Tier{
			{Name: "free", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 3)}},
			{Name: "paid", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 20)}},
		},
		Tier: planOf,
	}
}

// TestTiers drives a tiered policy through a real server: each plan gets
// its own limits and header item, one client's buckets of two plans never
// mix, and an unknown plan is refused as a key error.
func TestTiers(t *testing.T) {
	t.Parallel()
	c := newClock()
	h := withPlan(limited(t, memConfig(c), tieredPolicy(), &okHandler{}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	get := func(plan string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-API-Key", "same-client")
		if plan != "" {
			req.Header.Set("X-Plan", plan)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp
	}
	tests := []struct {
		plan, policy, rateLimit string
		admitted                int
	}{
		{"free", `"api.free";q=3;w=3`, `"api.free";r=2;t=1`, 3},
		{"paid", `"api.paid";q=20;w=2`, `"api.paid";r=19;t=0`, 20},
		{"", `"api";q=2;w=2`, `"api";r=1;t=1`, 2},
	}
	for _, tt := range tests {
		resp := get(tt.plan)
		if got := resp.Header.Get(HeaderRateLimitPolicy); got != tt.policy {
			t.Errorf("plan %q: RateLimit-Policy %s, want %s", tt.plan, got, tt.policy)
		}
		if got := resp.Header.Get(HeaderRateLimit); got != tt.rateLimit {
			t.Errorf("plan %q: RateLimit %s, want %s", tt.plan, got, tt.rateLimit)
		}
		n := 1
		for get(tt.plan).StatusCode == http.StatusOK {
			n++
		}
		// The same client exhausted the tiers before this one: had their
		// buckets mixed, fewer would be admitted here.
		if n != tt.admitted {
			t.Errorf("plan %q: %d admitted, want its burst %d", tt.plan, n, tt.admitted)
		}
	}
	if resp := get("gold"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("unknown plan: %d, want 400", resp.StatusCode)
	}
}

func TestTierErrors(t *testing.T) {
	t.Parallel()
	c := newClock()
	p := tieredPolicy()
	p.Limits = nil
	h := limited(t, memConfig(c), p, &okHandler{})
	// Without default limits a request without a plan cannot be served.
	if w := do(h, "k"); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "no tier") {
		t.Errorf("no plan and no default tier: %d %s", w.Code, w.Body)
	}
	p.Tier = func(*http.Request) (string, error) { return "", errBoom }
	h = limited(t, memConfig(c), p, &okHandler{})
	if w := do(h, "k"); w.Code != http.StatusBadRequest {
		t.Errorf("tier function error: %d, want 400", w.Code)
	}

	bad := []struct {
		name   string
		change func(*Policy)
		want   string
	}{
		{"tiers without a function", func(p *Policy) { p.Tier = nil }, "tier function"},
		{"function without tiers", func(p *Policy) { p.Tiers = nil }, "tier function"},
		{"duplicate tier", func(p *Policy) { p.Tiers[1].Name = "free" }, `both named "free"`},
		{"bad tier name", func(p *Policy) { p.Tiers[0].Name = "fr ee" }, "tiers[0].name"},
		{"tier without limits", func(p *Policy) { p.Tiers[0].Limits = nil }, "tiers[0]"},
		{"name too long in all", func(p *Policy) { p.Name = strings.Repeat("a", 62) }, "tiers[0]"},
	}
	for _, tt := range bad {
		p := tieredPolicy()
		tt.change(&p)
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, fleetrate.ErrInvalid) {
			t.Errorf("%s: Validate() = %v, want an ErrInvalid naming %q", tt.name, err, tt.want)
		}
	}
}
