package httplimit

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/gorilla/mux"

	"github.com/fleetrate/fleetrate"
)

// TestRouters mounts the middleware on one route of the standard mux, chi
// and gorilla/mux, keyed by each router's route pattern, and checks that
// the limited route is limited while its sibling is not.
func TestRouters(t *testing.T) {
	t.Parallel()
	policy := Policy{Name: "create", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 3)}}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })

	build := map[string]func(t *testing.T, c *clock) http.Handler{
		"net/http ServeMux": func(t *testing.T, c *clock) http.Handler {
			p := policy
			p.Key = Route()
			mw := middleware(t, c, p)
			m := http.NewServeMux()
			m.Handle("POST /v1/messages/{id}", mw(ok))
			m.Handle("GET /v1/messages/{id}", ok)
			return m
		},
		"chi": func(t *testing.T, c *clock) http.Handler {
			p := policy
			p.Key = func(r *http.Request) (string, error) {
				return "route:" + chi.RouteContext(r.Context()).RoutePattern(), nil
			}
			mw := middleware(t, c, p)
			r := chi.NewRouter()
			r.With(mw).Post("/v1/messages/{id}", ok)
			r.Get("/v1/messages/{id}", ok)
			return r
		},
		"gorilla": func(t *testing.T, c *clock) http.Handler {
			p := policy
			p.Key = func(r *http.Request) (string, error) {
				tpl, err := mux.CurrentRoute(r).GetPathTemplate()
				return "route:" + tpl, err
			}
			mw := middleware(t, c, p)
			r := mux.NewRouter()
			r.Handle("/v1/messages/{id}", mw(ok)).Methods(http.MethodPost)
			r.Handle("/v1/messages/{id}", ok).Methods(http.MethodGet)
			return r
		},
	}
	for name, b := range build {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := b(t, newClock())
			// Different ids, one route: one bucket of burst 3.
			for i, want := range []int{201, 201, 201, 429, 429} {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/messages/"+string(rune('a'+i)), nil))
				if w.Code != want {
					t.Fatalf("POST %d: status %d, want %d", i, w.Code, want)
				}
				if w.Header().Get(HeaderRateLimit) == "" {
					t.Errorf("POST %d: no RateLimit header", i)
				}
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/messages/a", nil))
			if w.Code != http.StatusCreated || w.Header().Get(HeaderRateLimit) != "" {
				t.Errorf("unlimited sibling route: %d with RateLimit %q", w.Code, w.Header().Get(HeaderRateLimit))
			}
		})
	}
}

func middleware(t *testing.T, c *clock, p Policy) func(http.Handler) http.Handler {
	t.Helper()
	m, err := New(memConfig(c))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := m.Limit(p)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}
