package transport_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// inMemory serves requests with h without a network, so that tests can run
// inside a synctest bubble. Like a real transport it closes the request
// body.
func inMemory(h http.Handler) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if err := r.Context().Err(); err != nil {
			return nil, err
		}
		in := r.Clone(r.Context())
		if in.Body == nil {
			in.Body = http.NoBody // as a server sees it
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, in)
		_ = in.Body.Close()
		resp := rec.Result()
		resp.Request = r
		return resp, nil
	})
}

// arrival is one request a fake upstream received.
type arrival struct {
	at   time.Time
	path string
	body string
}

// upstream is a scriptable fake server: it records every request and
// answers with the next scripted reply, or 200 when the script is empty.
type upstream struct {
	mu       sync.Mutex
	arrivals []arrival
	script   []reply
	always   *reply
}

type reply struct {
	status     int
	retryAfter string
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.arrivals = append(u.arrivals, arrival{at: time.Now(), path: r.URL.Path, body: string(body)})
	rep := reply{status: http.StatusOK}
	switch {
	case len(u.script) > 0:
		rep, u.script = u.script[0], u.script[1:]
	case u.always != nil:
		rep = *u.always
	}
	u.mu.Unlock()
	if rep.retryAfter != "" {
		w.Header().Set("Retry-After", rep.retryAfter)
	}
	w.WriteHeader(rep.status)
	fmt.Fprintf(w, "status %d", rep.status)
}

func (u *upstream) got() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]arrival(nil), u.arrivals...)
}

// quiet is a logger that drops everything.
var quiet = slog.New(slog.DiscardHandler)

// bookingCom is a one-endpoint upstream paced at rate/s with burst 1.
func bookingCom(rate float64) transport.Upstream {
	return transport.Upstream{
		Channel: "booking_com",
		Endpoints: []transport.Endpoint{
			{Name: "availability", Pattern: "/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(rate, 1)}},
		},
	}
}

// setup builds a limiter on a fresh memory store (call it inside the
// bubble, if any) and a transport over base.
func setup(t *testing.T, up transport.Upstream, base http.RoundTripper, opts transport.Options) (*transport.Transport, *fleetrate.Limiter) {
	t.Helper()
	return setupOn(t, memstore.New(memstore.Options{}), up, base, opts)
}

// setupOn is setup over store.
func setupOn(t *testing.T, store fleetrate.Store, up transport.Upstream, base http.RoundTripper, opts transport.Options) (*transport.Transport, *fleetrate.Limiter) {
	t.Helper()
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatalf("fleetrate.New: %v", err)
	}
	classify, err := up.Classifier()
	if err != nil {
		t.Fatalf("Classifier: %v", err)
	}
	opts.Base = base
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	tr, err := transport.New(lim, classify, opts)
	if err != nil {
		t.Fatalf("transport.New: %v", err)
	}
	return tr, lim
}

// fixedBackoff always sleeps d.
func fixedBackoff(d time.Duration) transport.Backoff {
	return func(int, time.Duration, time.Duration) time.Duration { return d }
}

func get(t *testing.T, ctx context.Context, rt http.RoundTripper, path string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://ota.test"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return resp, err
}

func post(t *testing.T, rt http.RoundTripper, path string, body io.Reader) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://ota.test"+path, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return resp, err
}
