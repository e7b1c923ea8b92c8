package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

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
		{"refund", "/v1/refund", `{"bucket":"api/send","n":1,"at_unix_micro":1}`},
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

// BenchmarkRLS decides ShouldRateLimit requests, one descriptor over
// 10,000 values and a limit never reached, through the service's decision
// path (no network) over the memory store: what a decision costs the
// service beyond gRPC, and its allocations.
//
//	go test -run '^$' -bench BenchmarkRLS$ -benchmem ./internal/server
func BenchmarkRLS(b *testing.B) {
	cfg, err := config.Load("bench.yaml", []byte(`
domain: bench
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1000000000}
`))
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(Options{Store: memstore.New(memstore.Options{}), Config: cfg, StoreBounded: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*rlspb.RateLimitRequest, 10_000)
	for i := range reqs {
		reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "bench:"+strconv.Itoa(i))}}
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		resp, err := s.shouldRateLimit(b.Context(), reqs[i%len(reqs)])
		if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
			b.Fatalf("%v, %v", resp, err)
		}
		i++
	}
}
