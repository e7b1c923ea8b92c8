package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server"
	"github.com/fleetrate/fleetrate/memstore"
)

// A worker in any language paces itself with POST /v1/wait: it books a
// token and sleeps the wait it is given.
func ExampleServer_Handler() {
	cfg, err := config.Load("fleetrate.yaml", []byte(`
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: second, requests_per_unit: 10, burst: 1}
`))
	if err != nil {
		panic(err)
	}
	srv, err := server.New(server.Options{
		Store:        memstore.New(memstore.Options{}),
		StoreBounded: true, // the memory store never waits: no timer per call, as serve runs it
		Config:       cfg,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	for range 2 {
		rec := httptest.NewRecorder()
		body := `{"bucket":"booking_com/availability","max_wait_ms":1000}`
		srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/wait", strings.NewReader(body)))
		var d struct {
			Allowed bool    `json:"allowed"`
			WaitMS  float64 `json:"wait_ms"`
		}
		if err := jsonDecode(rec.Body, &d); err != nil {
			panic(err)
		}
		fmt.Printf("%d allowed=%v wait>50ms=%v\n", rec.Code, d.Allowed, d.WaitMS > 50)
	}
	// Output:
	// 200 allowed=true wait>50ms=false
	// 200 allowed=true wait>50ms=true
}

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
