package doccheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server"
	"github.com/fleetrate/fleetrate/memstore"
)

// apiMetric is a row of docs/API.md's metrics table.
type apiMetric struct {
	labels []string
	// values are the documented values of the op label, if listed.
	values []string
	// redisOnly: the row says the service exports it only with Redis.
	redisOnly bool
}

// apiMetrics parses the table of docs/API.md, "GET /metrics".
func apiMetrics(t *testing.T) map[string]apiMetric {
	t.Helper()
	doc := readRefDoc(t, "docs/API.md")
	i := strings.Index(doc, "## GET /metrics")
	if i < 0 {
		t.Fatal(`docs/API.md has no "## GET /metrics" section`)
	}
	sec := doc[i:]
	if j := strings.Index(sec[1:], "\n## "); j >= 0 {
		sec = sec[:j+1]
	}
	parens := regexp.MustCompile(`\([^)]*\)`)
	opValues := regexp.MustCompile("`op` \\(([^)]*)\\)")
	rows := map[string]apiMetric{}
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "`fleetrate_") {
			continue
		}
		var m apiMetric
		m.redisOnly = strings.HasPrefix(strings.TrimSpace(cells[3]), "with Redis:")
		for _, l := range archBackticked.FindAllStringSubmatch(parens.ReplaceAllString(cells[2], ""), -1) {
			m.labels = append(m.labels, l[1])
		}
		if v := opValues.FindStringSubmatch(cells[2]); v != nil {
			for _, x := range archBackticked.FindAllStringSubmatch(v[1], -1) {
				m.values = append(m.values, x[1])
			}
		}
		slices.Sort(m.labels)
		slices.Sort(m.values)
		for _, n := range archBackticked.FindAllStringSubmatch(cells[1], -1) {
			rows[n[1]] = m
		}
	}
	return rows
}

// TestAPIMetricsAreTheServiceMetrics runs the service on the in-memory
// store, makes every kind of store call through its HTTP API, and holds
// docs/API.md's metrics table to what the service exports: the same
// fleetrate_* metrics, the same labels, and every op label value.
func TestAPIMetricsAreTheServiceMetrics(t *testing.T) {
	cfg, err := config.Load("fleetrate.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}
  - channel: booking_com
    endpoint: down
    rate_limit: {unit: second, requests_per_unit: 10}
  - name: llm/requests
    rate_limit: {unit: second, requests_per_unit: 10}
    in_flight: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := server.New(server.Options{
		Store:           downStore{memstore.New(memstore.Options{})},
		StoreBounded:    true, // the memory store never waits: no timer per call, as serve runs it
		Config:          cfg,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		Registry:        reg,
		LocalCacheBytes: 1 << 16,
	})
	if err != nil {
		t.Fatal(err)
	}
	send := func(path, body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.RemoteAddr = "127.0.0.1:1234" // a loopback caller: no tokens, every scope
		srv.Handler().ServeHTTP(rec, req)
		return rec
	}
	post := func(path, body string) map[string]any {
		t.Helper()
		rec := send(path, body)
		if rec.Code != http.StatusOK {
			t.Fatalf("POST %s %s: %d %s", path, body, rec.Code, rec.Body)
		}
		var v map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		return v
	}
	const b = `"bucket":"booking_com/availability"`
	took := post("/v1/take", `{`+b+`}`)
	at, _ := json.Marshal(took["at_unix_micro"])
	grant, _ := json.Marshal(took["grant"])
	post("/v1/refund", `{`+b+`,"at_unix_micro":`+string(at)+`,"grant":`+string(grant)+`}`)
	waited := post("/v1/wait", `{`+b+`,"n":15,"max_wait_ms":2000}`)
	booking, _ := json.Marshal(waited["booking"])
	post("/v1/cancel", `{`+b+`,"n":15,"booking":`+string(booking)+`}`) // the booking carries its grant
	metered := post("/v1/take", `{"costs":{"booking_com/availability":2}}`)
	settle, _ := json.Marshal(metered["settle_grant"])
	post("/v1/settle", `{"costs":{"booking_com/availability":2},"actual":{"booking_com/availability":1},"grant":`+string(settle)+`}`)
	acquired := post("/v1/acquire", `{"bucket":"llm/requests"}`)
	id, _ := json.Marshal(acquired["permit"].(map[string]any)["id"])
	post("/v1/renew", `{"bucket":"llm/requests","permit_id":`+string(id)+`}`)
	post("/v1/release", `{"bucket":"llm/requests","permit_id":`+string(id)+`}`)
	post("/v1/drain", `{`+b+`,"pause_ms":1}`)
	post("/v1/reset", `{"buckets":["booking_com/availability"]}`)
	// Nine of ten tokens: past the near-limit ratio (0.8).
	post("/json", `{"domain":"edge","hits_addend":9,"descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`)
	if rec := send("/v1/take", `{"bucket":"booking_com/down"}`); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("a take from a failing store: %d %s, want 503", rec.Code, rec.Body)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	documented := apiMetrics(t)
	exported := map[string]bool{}
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, "fleetrate_") {
			continue
		}
		exported[name] = true
		doc, ok := documented[name]
		if !ok {
			t.Errorf("the service exports %s; docs/API.md's metrics table does not list it", name)
			continue
		}
		var labels, ops []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
				if l.GetName() == "op" && !slices.Contains(ops, l.GetValue()) {
					ops = append(ops, l.GetValue())
				}
			}
		}
		slices.Sort(labels)
		slices.Sort(ops)
		if len(f.GetMetric()) > 0 && !slices.Equal(labels, doc.labels) {
			t.Errorf("%s: labels %v; docs/API.md lists %v", name, labels, doc.labels)
		}
		if doc.values != nil && f.GetType().String() == "HISTOGRAM" && !slices.Equal(ops, doc.values) {
			t.Errorf("%s: op values %v after every kind of store call; docs/API.md lists %v", name, ops, doc.values)
		}
	}
	for name, doc := range documented {
		// The failsafe breaker's metrics exist only over Redis; this test
		// runs the in-memory store (failsafe has tests of its own).
		if !exported[name] && !doc.redisOnly {
			t.Errorf("docs/API.md lists %s; the service does not export it", name)
		}
	}
}

// downStore fails every take of a bucket whose key ends in "/down".
type downStore struct{ fleetrate.Store }

func (s downStore) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	for _, b := range req.Buckets {
		if strings.HasSuffix(b.Key, "/down") {
			return fleetrate.Result{}, fmt.Errorf("%w: the test's store is down", fleetrate.ErrStoreUnavailable)
		}
	}
	return s.Store.Take(ctx, req)
}
