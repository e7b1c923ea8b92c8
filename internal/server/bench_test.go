package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server/wire"
	"github.com/fleetrate/fleetrate/memstore"
)

// benchServer is a server over the memory store whose limits never
// refuse, so that the benchmarks measure the allowed path of the HTTP API.
func benchServer(b *testing.B) *Server {
	b.Helper()
	cfg, err := config.Load("bench.yaml", []byte(`
buckets:
  - name: api/send
    rate_limit: {unit: second, requests_per_unit: 1000000000, burst: 1000000}
`))
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Options{Store: memstore.New(memstore.Options{}), Config: cfg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkHTTP measures a request through the HTTP API's whole handler
// (routing, auth, body, decoding, the store call, the JSON answer) over
// the memory store, without a network.
func BenchmarkHTTP(b *testing.B) {
	s := benchServer(b)
	key := DefaultPrefix + "api/send"
	for _, bc := range []struct{ name, path, body string }{
		{"take", "/v1/take", `{"bucket":"api/send","n":1}`},
		{"refund", "/v1/refund", `{"bucket":"api/send","n":1}`},
		{"store_take", wire.TakePath, `{"buckets":[{"key":"` + key + `","limits":[{"rate":1e9,"burst":1000000}]}],"n":1}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := s.Handler()
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, bc.path, strings.NewReader(bc.body))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if w.Code != http.StatusOK {
					b.Fatalf("%s: status %d: %s", bc.path, w.Code, w.Body)
				}
			}
		})
	}
}
