package server

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/internal/server/wire"
	"github.com/fleetrate/fleetrate/memstore"
)

var fuzzPaths = []string{"/json", "/v1/take", "/v1/wait", "/v1/refund", "/v1/cancel", "/v1/drain", "/v1/reset", wire.TakePath, wire.RefundPath, wire.DrainPath, wire.ResetPath,
	"/v1/settle", "/v1/acquire", "/v1/renew", "/v1/release", wire.SettlePath, wire.ReleasePath, wire.RenewPath}

// FuzzJSONAPI posts arbitrary bodies to every JSON endpoint: the service
// never panics, answers a decision (200 or 429) or a 400 with a JSON error
// naming a code, and never a 5xx (the memory store does not fail).
func FuzzJSONAPI(f *testing.F) {
	cfg, err := config.Load("fuzz.yaml", []byte(bucketConfig))
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(Options{
		Store:           memstore.New(memstore.Options{MaxKeys: 10000}),
		StoreBounded:    true, // the memory store never waits: no timer per call, as serve runs it
		Config:          cfg,
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxRequestBytes: 1 << 14,
	})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	seeds := []string{
		`{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"1.2.3.4"}]}]}`,
		`{"domain":"edge","hitsAddend":3,"descriptors":[{"entries":[{"key":"api_key","value":"k"}],"hits_addend":"0"},{"entries":[{"key":"ldap","value":"x"}],"limit":{"requests_per_unit":5,"unit":"MINUTE"}}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"x"}],"hits_addend":2,"is_negative_hits":true}]}`,
		`{"bucket":"booking_com/availability","n":1}`,
		`{"buckets":["booking_com/availability","booking_com"],"n":0}`,
		`{"bucket":"booking_com","n":2,"max_wait_ms":120.5}`,
		`{"bucket":"expedia/search","pause_ms":1000}`,
		`{"bucket":"expedia/search","until":"2030-01-01T00:00:00Z"}`,
		`{"buckets":[{"key":"k","limits":[{"rate":1,"burst":2}]}],"n":1,"max_wait_ns":1000}`,
		`{"keys":["a","b"]}`,
		`{"costs":{"booking_com":1,"booking_com/availability":2}}`,
		`{"bucket":"booking_com","n":1,"actual":{"booking_com":0},"at_unix_micro":1}`,
		`{"bucket":"booking_com","permit_id":"abc","ttl_ms":1000}`,
		`{"buckets":[{"key":"k","limits":[{"rate":1,"burst":2}],"in_flight":1}],"n":1,"permit":{"id":"a","ttl_ns":1000000000},"max_wait_ns":1000}`,
		`{"buckets":[{"key":"k","limits":[{"rate":1,"burst":2}],"in_flight":1}],"costs":[1],"actual":[2],"at_unix_micro":1}`,
		`{"buckets":[{"key":"k","limits":[{"rate":1,"burst":2}],"in_flight":1}],"id":"a","ttl_ns":1000000000}`,
		`{"domain":`, `[]`, `null`, `{"n":-1}`, `{"bucket":"booking_com","n":9223372036854775807}`,
	}
	for i, s := range seeds {
		f.Add(uint8(i), []byte(s))
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := fuzzPaths[int(which)%len(fuzzPaths)]
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.RemoteAddr = "127.0.0.1:1234" // a loopback client has every scope
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests:
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s %q: %d with a body that is not JSON: %q", path, body, rec.Code, rec.Body)
			}
		case http.StatusBadRequest, http.StatusForbidden: // 403: a key the configuration pins
			var e wire.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == "" || e.Error == "" {
				t.Fatalf("%s %q: %d without a JSON error: %q", path, body, rec.Code, rec.Body)
			}
		default:
			t.Fatalf("%s %q: status %d: %s", path, body, rec.Code, rec.Body)
		}
	})
}
