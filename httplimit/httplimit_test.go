package httplimit

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

func TestAllowedResponsesCarryHeaders(t *testing.T) {
	t.Parallel()
	c := newClock()
	h := limited(t, memConfig(c), messagesPolicy(), &okHandler{})

	w := do(h, "key-1")
	if w.Code != http.StatusOK {
		t.Fatalf("status %d, want 200", w.Code)
	}
	ps, err := headers.ParsePolicy(w.Header().Values(HeaderRateLimitPolicy)...)
	if err != nil {
		t.Fatalf("RateLimit-Policy %q does not follow the draft: %v", w.Header().Get(HeaderRateLimitPolicy), err)
	}
	if got, want := w.Header().Get(HeaderRateLimitPolicy), `"messages";q=20;w=2`; got != want {
		t.Errorf("RateLimit-Policy = %s, want %s", got, want)
	}
	if len(ps) != 1 || ps[0].Quota != 20 || ps[0].Window != 2*time.Second {
		t.Errorf("parsed policy %+v, want q=20 w=2s", ps)
	}
	if got, want := w.Header().Get(HeaderRateLimit), `"messages";r=19;t=0`; got != want {
		// t=0: the next token is 100 ms away, and rounding it up would
		// promise that no more than r are admitted within a whole second.
		t.Errorf("RateLimit = %s, want %s", got, want)
	}
	if w.Header().Get(HeaderRetryAfter) != "" {
		t.Errorf("an allowed response has Retry-After %q", w.Header().Get(HeaderRetryAfter))
	}
	if w.Header().Get(HeaderXRateLimitLimit) != "" {
		t.Errorf("legacy headers sent though not enabled")
	}
	// Remaining counts down with each request.
	for want := int64(18); want >= 10; want-- {
		if got := rateLimit(t, do(h, "key-1")).Remaining; got != want {
			t.Fatalf("remaining = %d, want %d", got, want)
		}
	}
}

func TestDenial(t *testing.T) {
	t.Parallel()
	c := newClock()
	cfg := memConfig(c)
	cfg.LegacyHeaders = true
	next := &okHandler{}
	h := limited(t, cfg, messagesPolicy(), next)
	for i := range 20 {
		if w := do(h, "k"); w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200", i, w.Code)
		}
	}
	w := do(h, "k")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("request 21: status %d, want 429", w.Code)
	}
	if next.count() != 20 {
		t.Errorf("handler ran %d times, want 20", next.count())
	}
	if got := w.Header().Get(HeaderRetryAfter); got != "1" {
		t.Errorf("Retry-After = %q, want 1 (100 ms rounded up)", got)
	}
	if got, want := w.Header().Get(HeaderRateLimit), `"messages";r=0;t=0`; got != want {
		t.Errorf("RateLimit = %s, want %s", got, want)
	}
	if got := w.Header().Get(HeaderRateLimitPolicy); got != `"messages";q=20;w=2` {
		t.Errorf("RateLimit-Policy = %s", got)
	}
	p := decodeProblem(t, w)
	if p.Type != ProblemQuotaExceeded || p.Title == "" || len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != "messages" {
		t.Errorf("problem = %+v", p)
	}
	if !strings.Contains(p.Detail, `"messages"`) || !strings.Contains(p.Detail, "20 requests per 2s") {
		t.Errorf("detail %q does not explain the limit", p.Detail)
	}
	wantReset := strconv.FormatInt(c.Now().Add(2*time.Second).Unix(), 10) // full again in 2 s
	for k, want := range map[string]string{HeaderXRateLimitLimit: "20", HeaderXRateLimitRemaining: "0", HeaderXRateLimitReset: wantReset} {
		if got := w.Header().Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

// TestRetryAfterIsObeyable drives buckets of several shapes to denial,
// then obeys Retry-After on the injected clock: the request must then be
// admitted, and one second earlier it must not be (so Retry-After is not
// needlessly late either). The effective window "t" never ends after
// Retry-After.
func TestRetryAfterIsObeyable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		limits []fleetrate.Limit
		cost   int64
	}{
		{"10/s burst 20", []fleetrate.Limit{fleetrate.PerSecond(10, 20)}, 1},
		{"3/s burst 5 (inexact interval)", []fleetrate.Limit{fleetrate.PerSecond(3, 5)}, 1},
		{"0.7/s burst 2", []fleetrate.Limit{fleetrate.PerSecond(0.7, 2)}, 1},
		{"1/min", []fleetrate.Limit{fleetrate.Every(time.Minute, 1)}, 1},
		{"100/min cost 7", []fleetrate.Limit{fleetrate.PerPeriod(100, time.Minute)}, 7},
		{"burst and hourly", []fleetrate.Limit{
			fleetrate.PerSecond(5, 10).Named("burst"),
			fleetrate.PerPeriod(40, time.Hour).Named("hourly"),
		}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(1, uint64(len(tt.name))))
			c := newClock()
			p := Policy{Name: "p", Limits: tt.limits, Cost: Weight(tt.cost)}
			h := limited(t, memConfig(c), p, &okHandler{})
			denials := 0
			for round := 0; denials < 15 && round < 5000; round++ {
				w := do(h, "client")
				if w.Code == http.StatusOK {
					// Let a little time pass now and then, so denials land
					// at arbitrary sub-second offsets.
					if rng.IntN(3) == 0 {
						c.Advance(time.Duration(rng.IntN(400_000)) * time.Microsecond)
					}
					continue
				}
				if w.Code != http.StatusTooManyRequests {
					t.Fatalf("status %d", w.Code)
				}
				denials++
				ra, ok := transport.ParseRetryAfter(w.Header().Get(HeaderRetryAfter), c.Now(), 400*24*time.Hour)
				if !ok || ra < time.Second {
					t.Fatalf("Retry-After %q: %v, %v", w.Header().Get(HeaderRetryAfter), ra, ok)
				}
				if rl := rateLimit(t, w); rl.Reset > ra {
					t.Errorf("RateLimit t=%v ends after Retry-After %v", rl.Reset, ra)
				}
				if ra > time.Second {
					c.Advance(ra - time.Second)
					if w := do(h, "client"); w.Code != http.StatusTooManyRequests {
						t.Fatalf("admitted one second before Retry-After %v: Retry-After is later than needed", ra)
					}
					c.Advance(time.Second)
				} else {
					c.Advance(ra)
				}
				if w := do(h, "client"); w.Code != http.StatusOK {
					t.Fatalf("denied (%d) after obeying Retry-After %v", w.Code, ra)
				}
			}
			if denials < 15 {
				t.Fatalf("only %d denials seen", denials)
			}
		})
	}
}

// TestEffectiveWindow checks that RateLimit's "t" is the time until the
// next token, on a limit slow enough to see it in whole seconds.
func TestEffectiveWindow(t *testing.T) {
	t.Parallel()
	c := newClock()
	p := Policy{Name: "slow", Limits: []fleetrate.Limit{fleetrate.PerPeriod(3, 3*time.Minute)}}
	h := limited(t, memConfig(c), p, &okHandler{})
	steps := []struct {
		advance time.Duration
		code    int
		want    string
		retry   string
	}{
		{0, 200, `"slow";r=2;t=60`, ""},
		{0, 200, `"slow";r=1;t=60`, ""},
		{30 * time.Second, 200, `"slow";r=0;t=30`, ""},
		{0, 429, `"slow";r=0;t=30`, "30"},
		{29 * time.Second, 429, `"slow";r=0;t=1`, "1"},
		{time.Second, 200, `"slow";r=0;t=60`, ""},
	}
	for i, st := range steps {
		c.Advance(st.advance)
		w := do(h, "k")
		if w.Code != st.code || w.Header().Get(HeaderRateLimit) != st.want || w.Header().Get(HeaderRetryAfter) != st.retry {
			t.Errorf("step %d: %d RateLimit %s Retry-After %q; want %d %s %q", i, w.Code,
				w.Header().Get(HeaderRateLimit), w.Header().Get(HeaderRetryAfter), st.code, st.want, st.retry)
		}
	}
}

func TestMultiLimitPolicyHeaders(t *testing.T) {
	t.Parallel()
	c := newClock()
	p := Policy{Name: "api", Limits: []fleetrate.Limit{
		fleetrate.PerSecond(10, 20).Named("burst"),
		fleetrate.PerPeriod(30, time.Hour).Named("hourly"),
	}}
	h := limited(t, memConfig(c), p, &okHandler{})
	w := do(h, "k")
	if got, want := w.Header().Get(HeaderRateLimitPolicy), `"api.burst";q=20;w=2, "api.hourly";q=30;w=3600`; got != want {
		t.Errorf("RateLimit-Policy = %s, want %s", got, want)
	}
	if got, want := w.Header().Get(HeaderRateLimit), `"api.burst";r=19;t=0`; got != want {
		t.Errorf("RateLimit = %s, want %s", got, want)
	}
	// After 20 requests spaced out so the burst refills, the hourly limit
	// is the tightest and the one reported.
	for range 24 {
		c.Advance(time.Second)
		w = do(h, "k")
	}
	rl := rateLimit(t, w)
	if rl.Name != "api.hourly" || rl.Remaining != 5 {
		t.Errorf("RateLimit = %+v, want api.hourly with 5 left", rl)
	}
	// t is the time until the hourly limit's next token: 25 takes of 120 s
	// each over 24 s leave a debt of 2976 s, 5 tokens and 96 s of the sixth.
	if !rl.HasReset || rl.Reset != 96*time.Second {
		t.Errorf("RateLimit = %+v, want t=96", rl)
	}
	for range 5 {
		do(h, "k")
	}
	w = do(h, "k")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429 from the hourly limit", w.Code)
	}
	if p := decodeProblem(t, w); p.ViolatedPolicies[0] != "api.hourly" {
		t.Errorf("violated %v, want api.hourly", p.ViolatedPolicies)
	}
	ra, _ := strconv.Atoi(w.Header().Get(HeaderRetryAfter))
	// 30 taken in 24 s at 30/h (one token per 120 s): 0.2 of a token is
	// back, so the next one is 96 s away.
	if ra != 96 {
		t.Errorf("Retry-After = %d, want 96", ra)
	}
}

func TestShadowMode(t *testing.T) {
	t.Parallel()
	c := newClock()
	logs := &logbuf.Buffer{}
	reg := prometheus.NewRegistry()
	cfg := memConfig(c)
	cfg.Logger, cfg.Registerer = testLogger(logs), reg
	p := messagesPolicy()
	p.Shadow = true
	next := &okHandler{}
	h := limited(t, cfg, p, next)
	for range 25 {
		if w := do(h, "k"); w.Code != http.StatusOK {
			t.Fatalf("shadow mode answered %d", w.Code)
		}
	}
	w := do(h, "k")
	if rl := rateLimit(t, w); rl.Remaining != 0 {
		t.Errorf("shadow RateLimit = %+v, want r=0", rl)
	}
	if w.Header().Get(HeaderRetryAfter) != "" {
		t.Errorf("shadow mode sent Retry-After on a 200")
	}
	if next.count() != 26 {
		t.Errorf("handler ran %d times, want 26", next.count())
	}
	if got := counter(t, reg, "fleetrate_http_requests_total", map[string]string{"policy": "messages", "outcome": OutcomeShadowDenied}); got != 6 {
		t.Errorf("shadow_denied = %v, want 6", got)
	}
	if !strings.Contains(logs.String(), "shadow mode: request would be rate limited") {
		t.Errorf("no shadow log line in %q", logs.String())
	}
}

func TestStoreFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		failClosed bool
		shadow     bool
		block      bool
		wantStatus int
		outcome    string
	}{
		{"fail open", false, false, false, http.StatusOK, OutcomeFailOpen},
		{"fail closed", true, false, false, http.StatusServiceUnavailable, OutcomeFailClosed},
		{"fail closed on timeout", true, false, true, http.StatusServiceUnavailable, OutcomeFailClosed},
		{"fail open on timeout", false, false, true, http.StatusOK, OutcomeFailOpen},
		{"shadow never blocks", true, true, false, http.StatusOK, OutcomeFailOpen},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			logs := &logbuf.Buffer{}
			reg := prometheus.NewRegistry()
			store := &failingStore{block: tt.block}
			next := &okHandler{}
			h := limited(t, Config{
				Store:      store,
				Key:        APIKey("X-API-Key"),
				FailClosed: tt.failClosed,
				Shadow:     tt.shadow,
				Timeout:    20 * time.Millisecond,
				Logger:     testLogger(logs),
				Registerer: reg,
			}, messagesPolicy(), next)
			const n = 5
			for range n {
				w := do(h, "k")
				if w.Code == http.StatusTooManyRequests {
					t.Fatalf("a store failure was answered 429")
				}
				if w.Code != tt.wantStatus {
					t.Fatalf("status %d, want %d", w.Code, tt.wantStatus)
				}
				if w.Code == http.StatusServiceUnavailable {
					if p := decodeProblem(t, w); !strings.Contains(p.Detail, "unavailable") {
						t.Errorf("503 problem %+v", p)
					}
				}
			}
			wantCalls := n
			if tt.wantStatus != http.StatusOK {
				wantCalls = 0
			}
			if next.count() != wantCalls {
				t.Errorf("handler ran %d times, want %d", next.count(), wantCalls)
			}
			if got := counter(t, reg, "fleetrate_http_store_errors_total", map[string]string{"policy": "messages"}); got != n {
				t.Errorf("store errors counted %v, want %d", got, n)
			}
			if got := counter(t, reg, "fleetrate_http_requests_total", map[string]string{"outcome": tt.outcome}); got != n {
				t.Errorf("%s counted %v, want %d", tt.outcome, got, n)
			}
			// Logged, but not once per request.
			if c := strings.Count(logs.String(), "rate limit store failed"); c != 1 {
				t.Errorf("store failure logged %d times, want 1 (throttled): %s", c, logs.String())
			}
		})
	}
}

func TestClientGoneIsNotAStoreError(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	next := &okHandler{}
	h := limited(t, Config{Store: &failingStore{block: true}, Key: APIKey("X-API-Key"), FailClosed: true,
		Logger: slog.New(slog.DiscardHandler), Registerer: reg, Timeout: -1}, messagesPolicy(), next)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "k")
	ctx, cancel := context.WithCancel(r.Context())
	cancel()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r.WithContext(ctx))
	if next.count() != 0 || w.Body.Len() != 0 {
		t.Errorf("a request whose client left was served: %d %q", w.Code, w.Body.String())
	}
	if got := counter(t, reg, "fleetrate_http_store_errors_total", nil); got != 0 {
		t.Errorf("client cancellation counted as %v store errors", got)
	}
}

func TestCost(t *testing.T) {
	t.Parallel()
	c := newClock()
	p := messagesPolicy()
	p.Cost = Weight(5)
	h := limited(t, memConfig(c), p, &okHandler{})
	for i := range 4 {
		if w := do(h, "k"); w.Code != http.StatusOK {
			t.Fatalf("request %d of weight 5: %d", i, w.Code)
		}
	}
	w := do(h, "k")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("fifth request of weight 5 with burst 20: %d", w.Code)
	}
	if got := w.Header().Get(HeaderRetryAfter); got != "1" {
		t.Errorf("Retry-After = %s, want 1 (500 ms)", got)
	}
	if p := decodeProblem(t, w); !strings.Contains(p.Detail, "costs 5") {
		t.Errorf("detail %q does not mention the cost", p.Detail)
	}
}

func TestCostErrors(t *testing.T) {
	t.Parallel()
	c := newClock()
	p := messagesPolicy()
	p.Cost = Weight(21)
	h := limited(t, memConfig(c), p, &okHandler{})
	w := do(h, "k")
	if w.Code != http.StatusTooManyRequests || w.Header().Get(HeaderRetryAfter) != "" {
		t.Errorf("cost above burst: %d with Retry-After %q; want 429 without Retry-After", w.Code, w.Header().Get(HeaderRetryAfter))
	}
	// The headers are complete: the policy and what is left, untouched by
	// the refused request.
	if got, want := w.Header().Get(HeaderRateLimitPolicy), `"messages";q=20;w=2`; got != want {
		t.Errorf("RateLimit-Policy = %s, want %s", got, want)
	}
	if got, want := w.Header().Get(HeaderRateLimit), `"messages";r=20;t=0`; got != want {
		t.Errorf("RateLimit = %s, want %s", got, want)
	}
	if p := decodeProblem(t, w); !strings.Contains(p.Detail, "never") {
		t.Errorf("detail %q", p.Detail)
	}

	p.Cost = func(*http.Request) (int64, error) { return 0, errBoom }
	h = limited(t, memConfig(c), p, &okHandler{})
	if w := do(h, "k"); w.Code != http.StatusBadRequest {
		t.Errorf("cost error: %d, want 400", w.Code)
	}
	p.Cost = func(*http.Request) (int64, error) { return -1, nil }
	h = limited(t, memConfig(c), p, &okHandler{})
	if w := do(h, "k"); w.Code != http.StatusBadRequest {
		t.Errorf("negative cost: %d, want 400", w.Code)
	}
}

func TestBodySize(t *testing.T) {
	t.Parallel()
	f := BodySize(1024, 10*1024)
	tests := []struct {
		length int64
		want   int64
	}{
		{0, 1}, {1, 1}, {1024, 1}, {1025, 2}, {4096, 4}, {-1, 10}, {1 << 40, 10},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.ContentLength = tt.length
		if got, err := f(r); err != nil || got != tt.want {
			t.Errorf("BodySize cost of %d bytes = %d, %v; want %d", tt.length, got, err, tt.want)
		}
	}
	if got, _ := BodySize(0, -5)(httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(make([]byte, 10)))); got != 1 {
		t.Errorf("BodySize(0, -5) = %d, want 1", got)
	}
	if got, _ := Weight(-3)(nil); got != 0 {
		t.Errorf("Weight(-3) = %d, want 0", got)
	}
}

func TestKeyErrors(t *testing.T) {
	t.Parallel()
	c := newClock()
	next := &okHandler{}
	h := limited(t, memConfig(c), messagesPolicy(), next)
	w := do(h, "")
	if w.Code != http.StatusBadRequest {
		t.Fatalf("missing key: %d, want 400", w.Code)
	}
	if p := decodeProblem(t, w); !strings.Contains(p.Detail, "X-Api-Key") {
		t.Errorf("detail %q does not name the header", p.Detail)
	}
	cfg := memConfig(c)
	cfg.KeyError = func(w http.ResponseWriter, _ *http.Request, err error) {
		WriteProblem(w, http.StatusUnauthorized, Problem{Title: "Unauthorized", Detail: err.Error()})
	}
	h = limited(t, cfg, messagesPolicy(), next)
	if w := do(h, ""); w.Code != http.StatusUnauthorized {
		t.Errorf("custom KeyError: %d, want 401", w.Code)
	}
	p := messagesPolicy()
	p.Key = func(*http.Request) (string, error) { return "", nil }
	h = limited(t, memConfig(c), p, next)
	if w := do(h, "k"); w.Code != http.StatusBadRequest {
		t.Errorf("empty key: %d, want 400", w.Code)
	}
	if next.count() != 0 {
		t.Errorf("handler ran %d times for unidentified clients", next.count())
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	store := memstore.New(memstore.Options{})
	if _, err := New(Config{}); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), "store") {
		t.Errorf("New without store: %v", err)
	}
	if _, err := New(Config{Store: store, Prefix: strings.Repeat("x", 300)}); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("New with a 300-byte prefix: %v", err)
	}
	m, err := New(Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	one := []fleetrate.Limit{fleetrate.PerSecond(1, 1)}
	tests := []struct {
		name string
		p    Policy
		want string
	}{
		{"no name", Policy{Limits: one}, "name"},
		{"bad name", Policy{Name: "a b", Limits: one}, `"a b"`},
		{"brace in name", Policy{Name: "{tag}", Limits: one}, "name"},
		{"long name", Policy{Name: strings.Repeat("a", 65), Limits: one}, "name"},
		{"no limits", Policy{Name: "p"}, "at least one limit"},
		{"bad rate", Policy{Name: "p", Limits: []fleetrate.Limit{{Rate: -1, Burst: 1}}}, "limits[0]: rate"},
		{"bad burst", Policy{Name: "p", Limits: []fleetrate.Limit{{Rate: 1, Burst: 0}}}, "limits[0]: burst"},
		{"unnamed limits", Policy{Name: "p", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1), fleetrate.PerSecond(2, 2)}}, "limits[0].name"},
		{"duplicate limit names", Policy{Name: "p", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1).Named("a"), fleetrate.PerSecond(2, 2).Named("a")}}, "both named"},
		{"bad unit", Policy{Name: "p", Limits: one, Unit: "bytes"}, "unit"},
	}
	for _, tt := range tests {
		_, err := m.Limit(tt.p)
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Limit error %v, want ErrInvalid mentioning %q", tt.name, err, tt.want)
		}
	}
	if _, err := m.Limit(Policy{Name: "same", Limits: one}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Limit(Policy{Name: "same", Limits: one}); err != nil {
		t.Errorf("mounting a policy twice with the same limits: %v", err)
	}
	if _, err := m.Limit(Policy{Name: "same", Limits: []fleetrate.Limit{fleetrate.PerSecond(2, 2)}}); err == nil {
		t.Errorf("mounting a policy name twice with different limits succeeded")
	}
}

func TestMetricsShareARegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c := newClock()
	cfg := memConfig(c)
	cfg.Registerer = reg
	h1 := limited(t, cfg, messagesPolicy(), &okHandler{})
	h2 := limited(t, cfg, Policy{Name: "other", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}, &okHandler{})
	do(h1, "a")
	do(h2, "a")
	do(h2, "a")
	if got := counter(t, reg, "fleetrate_http_requests_total", map[string]string{"policy": "messages", "outcome": OutcomeAllowed}); got != 1 {
		t.Errorf("messages allowed = %v, want 1", got)
	}
	if got := counter(t, reg, "fleetrate_http_requests_total", map[string]string{"policy": "other", "outcome": OutcomeDenied}); got != 1 {
		t.Errorf("other denied = %v, want 1", got)
	}
}

// TestTwoServersShareOneBudget runs two servers over one store, as two
// instances of a service share one Redis, and checks that a client
// alternating between them gets one budget, not two.
func TestTwoServersShareOneBudget(t *testing.T) {
	t.Parallel()
	c := newClock()
	store := memstore.New(memstore.Options{Clock: c.Now})
	var servers []*httptest.Server
	for range 2 {
		h := limited(t, Config{Store: store, Key: APIKey("X-API-Key")}, messagesPolicy(), &okHandler{})
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}
	admitted := 0
	for i := range 40 {
		req, _ := http.NewRequest(http.MethodPost, servers[i%2].URL, nil)
		req.Header.Set("X-API-Key", "shared")
		resp, err := servers[i%2].Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			admitted++
		}
	}
	if admitted != 20 {
		t.Errorf("admitted %d across two servers at one instant, want the burst of 20", admitted)
	}
}

// TestNilHandlerIsAnError: a middleware given a nil handler answers 500
// saying so, rather than panicking on the first request.
func TestNilHandlerIsAnError(t *testing.T) {
	t.Parallel()
	limit := onePolicy(t, APIKey("X-API-Key"))
	w := httptest.NewRecorder()
	limit(nil).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "nil http.Handler") {
		t.Fatalf("a nil handler: %d %q, want 500 saying so", w.Code, w.Body)
	}
}

// TestEmptyAPIKeyHeaderIsAServerError: APIKey("") cannot fail when it is
// made, so every request fails with an error naming it, answered 500 (the
// server's mistake), never 400 blaming the client for a missing " header".
func TestEmptyAPIKeyHeaderIsAServerError(t *testing.T) {
	t.Parallel()
	limit := onePolicy(t, APIKey(""))
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "k")
	limit(http.NotFoundHandler()).ServeHTTP(w, r)
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "header name must not be empty") {
		t.Fatalf("APIKey(\"\"): %d %q, want 500 naming the empty header name", w.Code, w.Body)
	}
}

// onePolicy returns the middleware of one policy, 1/s burst 2, keyed by
// key, over an in-memory store.
func onePolicy(t *testing.T, key KeyFunc) func(http.Handler) http.Handler {
	t.Helper()
	m, err := New(Config{Store: memstore.New(memstore.Options{}), Key: key})
	if err != nil {
		t.Fatal(err)
	}
	limit, err := m.Limit(Policy{Name: "p", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}})
	if err != nil {
		t.Fatal(err)
	}
	return limit
}
