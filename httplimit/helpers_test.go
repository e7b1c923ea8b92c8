package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/memstore"
)

// clock is a manual clock for memstore: time moves only when a test
// advances it.
type clock = manualclock.Clock

func newClock() *clock { return manualclock.New(time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)) }

// recordingStore wraps a store and records the keys it was asked for.
type recordingStore struct {
	fleetrate.Store
	mu   sync.Mutex
	keys []string
}

func (s *recordingStore) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	s.mu.Lock()
	for _, b := range req.Buckets {
		s.keys = append(s.keys, b.StoreKey())
	}
	s.mu.Unlock()
	return s.Store.Take(ctx, req)
}

func (s *recordingStore) lastKey() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.keys) == 0 {
		return ""
	}
	return s.keys[len(s.keys)-1]
}

// failingStore is a store that is down: every call fails the way a
// store must report its own failures, wrapping ErrStoreUnavailable. With
// block set it instead hangs until the context ends, like a paused Redis.
type failingStore struct {
	block bool
	calls int
	mu    sync.Mutex
}

var _ fleetrate.Store = (*failingStore)(nil)

func (s *failingStore) fail(ctx context.Context) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.block {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", fleetrate.ErrStoreUnavailable, ctx.Err())
	}
	return fmt.Errorf("%w: dial tcp 127.0.0.1:6379: connection refused", fleetrate.ErrStoreUnavailable)
}

func (s *failingStore) Take(ctx context.Context, _ fleetrate.Request) (fleetrate.Result, error) {
	return fleetrate.Result{}, s.fail(ctx)
}
func (s *failingStore) Refund(ctx context.Context, _ []fleetrate.Bucket, _ int64, _ time.Time) error {
	return s.fail(ctx)
}
func (s *failingStore) Cancel(ctx context.Context, _ []fleetrate.Bucket, _ int64, _ fleetrate.Booking) error {
	return s.fail(ctx)
}
func (s *failingStore) Drain(ctx context.Context, _ []fleetrate.Bucket, _ time.Duration) error {
	return s.fail(ctx)
}
func (s *failingStore) Reset(ctx context.Context, _ ...string) error { return s.fail(ctx) }
func (s *failingStore) DrainEach(ctx context.Context, _ []fleetrate.Drain) error {
	return s.fail(ctx)
}
func (s *failingStore) Settle(ctx context.Context, _ []fleetrate.Bucket, _ fleetrate.Settlement) error {
	return s.fail(ctx)
}
func (s *failingStore) Release(ctx context.Context, _ []fleetrate.Bucket, _ string) (int, error) {
	return 0, s.fail(ctx)
}
func (s *failingStore) Renew(ctx context.Context, _ []fleetrate.Bucket, _ fleetrate.Permit) (int, error) {
	return 0, s.fail(ctx)
}

// okHandler answers 200 "ok" and counts its calls.
type okHandler struct {
	mu    sync.Mutex
	calls int
}

func (h *okHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	_, _ = io.WriteString(w, "ok")
}

func (h *okHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// limited builds a handler behind one policy.
func limited(t testing.TB, cfg Config, p Policy, next http.Handler) http.Handler {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	mw, err := m.Limit(p)
	if err != nil {
		t.Fatalf("Limit: %v", err)
	}
	return mw(next)
}

// do sends one request with the given API key straight to h.
func do(h http.Handler, apiKey string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{}`))
	if apiKey != "" {
		r.Header.Set("X-API-Key", apiKey)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// rateLimit parses the RateLimit header of a response with the draft's
// grammar and returns its single item.
func rateLimit(t testing.TB, w *httptest.ResponseRecorder) headers.Limit {
	t.Helper()
	v := w.Header().Values(HeaderRateLimit)
	ls, err := headers.ParseRateLimit(v...)
	if err != nil {
		t.Fatalf("RateLimit %q does not follow the draft: %v", v, err)
	}
	if len(ls) != 1 {
		t.Fatalf("RateLimit %q has %d items, want 1", v, len(ls))
	}
	return ls[0]
}

func decodeProblem(t testing.TB, w *httptest.ResponseRecorder) Problem {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != ProblemContentType {
		t.Fatalf("Content-Type = %q, want %q", ct, ProblemContentType)
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q is not JSON: %v", w.Body.String(), err)
	}
	if p.Status != w.Code {
		t.Errorf("problem status %d, response status %d", p.Status, w.Code)
	}
	return p
}

// counter returns the value of a counter in a registry, 0 when absent.
func counter(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func testLogger(buf io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func messagesPolicy() Policy {
	return Policy{Name: "messages", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 20)}}
}

func memConfig(c *clock) Config {
	return Config{
		Store:  memstore.New(memstore.Options{Clock: c.Now}),
		Key:    APIKey("X-API-Key"),
		Logger: slog.New(slog.DiscardHandler),
	}
}

var errBoom = errors.New("boom")
