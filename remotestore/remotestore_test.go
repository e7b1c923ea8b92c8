package remotestore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/remotestore"
	"github.com/fleetrate/fleetrate/storetest"
)

// serve runs a fleetrate service over a memory store on a loopback port
// and returns its base URL.
func serve(t *testing.T, tokens ...string) string {
	t.Helper()
	cfg, err := config.Load("empty.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Options{
		Store:        memstore.New(memstore.Options{}),
		StoreBounded: true, // as serve runs it: a memstore never waits
		Config:       cfg,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		AuthTokens:   tokens,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func newStore(t *testing.T, url string, opts remotestore.Options) *remotestore.Store {
	t.Helper()
	s, err := remotestore.New(url, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	url := serve(t)
	storetest.Run(t, func(t *testing.T) fleetrate.Store {
		// 10 s, not the default 1 s: the scenarios run in parallel, the
		// permit ones too now, and under -race on a loaded 2-core machine
		// a take of ConcurrentExact's burst has taken over 1 s.
		return newStore(t, url, remotestore.Options{Timeout: 10 * time.Second})
	})
}

func TestAuthToken(t *testing.T) {
	t.Parallel()
	url := serve(t, "s3cret")
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}, N: 1}
	_, err := newStore(t, url, remotestore.Options{}).Take(context.Background(), req)
	if !errors.Is(err, fleetrate.ErrStoreUnavailable) {
		t.Errorf("without token: err = %v, want ErrStoreUnavailable", err)
	}
	res, err := newStore(t, url, remotestore.Options{Token: "s3cret"}).Take(context.Background(), req)
	if err != nil || !res.Allowed {
		t.Errorf("with token: %+v, %v", res, err)
	}
}

func TestFailuresAreErrorsNotDenials(t *testing.T) {
	t.Parallel()
	req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}, N: 1}
	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(release) }) // runs first
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("<html>not json</html>"))
	}))
	t.Cleanup(garbage.Close)
	proxyErr := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad gateway", http.StatusBadGateway)
	}))
	t.Cleanup(proxyErr.Close)
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"redis down","code":"store_unavailable"}`))
	}))
	t.Cleanup(down.Close)

	for _, tc := range []struct{ name, url string }{
		{"connection refused", closed},
		{"timeout", slow.URL},
		{"not JSON", garbage.URL},
		{"proxy error", proxyErr.URL},
		{"store down behind the service", down.URL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, tc.url, remotestore.Options{Timeout: 100 * time.Millisecond})
			res, err := s.Take(context.Background(), req)
			if !errors.Is(err, fleetrate.ErrStoreUnavailable) || res.Allowed {
				t.Errorf("Take = %+v, %v; want an ErrStoreUnavailable error", res, err)
			}
			if err := s.Refund(context.Background(), req.Buckets, 1, time.Now()); !errors.Is(err, fleetrate.ErrStoreUnavailable) {
				t.Errorf("Refund: %v", err)
			}
		})
	}
}

func TestInvalidArgumentsNeedNoRoundTrip(t *testing.T) {
	t.Parallel()
	s := newStore(t, "http://127.0.0.1:1", remotestore.Options{})
	_, err := s.Take(context.Background(), fleetrate.Request{Buckets: []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}}}, N: 3})
	if !errors.Is(err, fleetrate.ErrBurstExceeded) {
		t.Errorf("n > burst: %v", err)
	}
	if err := s.Drain(context.Background(), []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "k", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)}}}, -time.Second); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("negative drain: %v", err)
	}
	for _, u := range []string{"", "redis://x:1", "http://", "::"} {
		if _, err := remotestore.New(u, remotestore.Options{}); !errors.Is(err, fleetrate.ErrInvalid) {
			t.Errorf("New(%q): %v, want ErrInvalid", u, err)
		}
	}
}

// ExampleNew shows a Go worker sharing the service's buckets through a
// Limiter. Here the service runs in-process on a loopback port; a real
// worker gives the service's address, e.g. "http://fleetrate:8080".
func ExampleNew() {
	cfg, _ := config.Load("fleetrate.yaml", nil)
	srv, err := server.New(server.Options{
		Store:        memstore.New(memstore.Options{}),
		StoreBounded: true, // as serve runs it: a memstore never waits
		Config:       cfg,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	service := httptest.NewServer(srv.Handler())
	defer service.Close()

	store, err := remotestore.New(service.URL, remotestore.Options{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	lim, err := fleetrate.New(store, fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{{
			Name:   "{booking_com}/availability",
			Limits: []fleetrate.Limit{fleetrate.PerSecond(20, 40)},
		}},
	})
	if err != nil {
		panic(err)
	}
	res, err := lim.AllowN(context.Background(), 10, "{booking_com}/availability")
	if err != nil {
		panic(err) // the service or its store is down: fail open or closed
	}
	fmt.Println(res.Allowed, res.Remaining)
	// Output: true 30
}
