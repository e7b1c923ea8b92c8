package httplimit

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/fleetrate/fleetrate"
)

// TestInFlightBoundPerClient: with a bound of 2, a client's third request
// while two run is answered 429 without Retry-After; another client is
// unaffected; once a handler returns, its permit serves the next request.
func TestInFlightBoundPerClient(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fast") == "" {
			entered <- struct{}{}
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})
	p := Policy{Name: "messages", Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 100)}, InFlight: 2}
	h := limited(t, memConfig(newClock()), p, slow)

	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if w := do(h, "key-1"); w.Code != http.StatusOK {
				t.Errorf("a request within the bound: %d", w.Code)
			}
		})
	}
	<-entered
	<-entered
	w := do(h, "key-1")
	if w.Code != http.StatusTooManyRequests || w.Header().Get(HeaderRetryAfter) != "" {
		t.Fatalf("a third request in flight: %d, Retry-After %q; want 429 without Retry-After", w.Code, w.Header().Get(HeaderRetryAfter))
	}
	if w.Header().Get(HeaderRateLimit) == "" {
		t.Error("the refusal carries no RateLimit field for the rate")
	}
	other := make(chan int)
	go func() { other <- do(h, "key-2").Code }()
	<-entered
	close(release)
	if code := <-other; code != http.StatusOK {
		t.Fatalf("another client's request: %d, want 200", code)
	}
	wg.Wait()
	r := doPath(h, "key-1", "/v1/messages?fast=1")
	if r.Code != http.StatusOK {
		t.Fatalf("a request after the handlers returned: %d, want 200 (their permits back)", r.Code)
	}
}

// TestInFlightInvalid: a negative or huge bound names the field.
func TestInFlightInvalid(t *testing.T) {
	for _, n := range []int64{-1, fleetrate.MaxInFlight + 1} {
		p := messagesPolicy()
		p.InFlight = n
		if err := p.Validate(); err == nil {
			t.Errorf("Policy{InFlight: %d}.Validate() = nil, want an error naming in flight", n)
		}
	}
}

// doPath is do for a request to path.
func doPath(h http.Handler, apiKey, path string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{}`))
	r.Header.Set("X-API-Key", apiKey)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}
