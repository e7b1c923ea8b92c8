package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/transport"
)

const upstreamsYAML = `
upstreams:
  - channel: booking_com
    credential: {rate_limit: {unit: second, requests_per_unit: 30}}
    drain_credential: true
    credential_in_flight: 8
    priorities: [{name: bulk, reserve: 5, horizon: 2s}]
    meters: [{name: tokens, rate_limit: {unit: minute, requests_per_unit: 90000}}]
    headers: {forms: [draft, openai], window: 1m}
    max_attempts: 3
    endpoints:
      - name: availability
        pattern: "POST /v1/hotels/{id}/availability"
        rate_limit: {unit: second, requests_per_unit: 19, burst: 1}
        spacing: 50ms
        priority: bulk
        in_flight: 4
        costs: {tokens: 1200}
      - name: reservations
        pattern: "GET /v1/reservations"
        rate_limits:
          - {unit: second, requests_per_unit: 5}
          - {unit: minute, requests_per_unit: 100}
`

func TestUpstreams(t *testing.T) {
	cfg, err := config.Load("up.yaml", []byte(upstreamsYAML))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Upstreams) != 1 {
		t.Fatalf("got %d upstreams, want 1", len(cfg.Upstreams))
	}
	u := cfg.Upstreams[0]
	ep := u.Endpoints[0]
	switch {
	case u.Channel != "booking_com" || !u.DrainCredential || u.CredentialInFlight != 8 || u.MaxAttempts != 3:
		t.Errorf("upstream = %+v", u)
	case len(u.Credential) != 1 || u.Credential[0].Rate != 30 || u.Credential[0].Burst != 30:
		t.Errorf("credential = %+v, want 30/s burst 30", u.Credential)
	case len(u.Priorities) != 1 || u.Priorities[0] != (fleetrate.Priority{Name: "bulk", Reserve: 5, Horizon: 2 * time.Second}):
		t.Errorf("priorities = %+v", u.Priorities)
	case len(u.Meters) != 1 || u.Meters[0].Name != "tokens" || u.Meters[0].Limits[0].Burst != 90000:
		t.Errorf("meters = %+v", u.Meters)
	case u.Headers.Forms != transport.HeadersDraft|transport.HeadersOpenAI || u.Headers.Window != time.Minute:
		t.Errorf("headers = %+v", u.Headers)
	case ep.Name != "availability" || ep.Spacing != 50*time.Millisecond || ep.InFlight != 4 || ep.Priority != "bulk" || ep.Costs["tokens"] != 1200:
		t.Errorf("endpoint = %+v", ep)
	case len(u.Endpoints[1].Limits) != 2:
		t.Errorf("reservations limits = %+v, want 2", u.Endpoints[1].Limits)
	}
}

func TestUpstreamsBadInput(t *testing.T) {
	for _, tc := range []struct{ name, old, new, want string }{
		{"unknown form", "forms: [draft, openai]", "forms: [draft, openapi]", `headers.forms[1]: unknown form "openapi"`},
		{"in flight", "in_flight: 4", "in_flight: -1", "endpoints[0].in_flight: must be between 1 and"},
		{"attempts", "max_attempts: 3", "max_attempts: 0", "max_attempts: must be between 1 and 100"},
		{"spacing", "spacing: 50ms", "spacing: soon", "endpoints[0].spacing: must be a duration"},
		{"unknown field", "fixed: false", "", ""},
		{"meter cost", "costs: {tokens: 1200}", "costs: {tokens: -5}", "costs.tokens: must be between 0 and"},
		{"unknown meter", "costs: {tokens: 1200}", "costs: {words: 5}", `words`},
		{"pattern", `pattern: "GET /v1/reservations"`, `pattern: "POST /v1/hotels/{id}/availability"`, "pattern"},
		{"no limits", "rate_limit: {unit: second, requests_per_unit: 19, burst: 1}", "", "upstreams[0].endpoints[0]: needs rate_limit or rate_limits"},
		{"typo", "drain_credential: true", "drain_credentials: true", "drain_credentials: unknown field"},
	} {
		if tc.want == "" {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			data := strings.Replace(upstreamsYAML, tc.old, tc.new, 1)
			_, err := config.Load("up.yaml", []byte(data))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Load = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestUpstreamChannelClashes(t *testing.T) {
	data := upstreamsYAML + `
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: second, requests_per_unit: 20}
`
	_, err := config.Load("up.yaml", []byte(data))
	if err == nil || !strings.Contains(err.Error(), `channel "booking_com" is also a channel of the buckets section`) {
		t.Fatalf("Load = %v, want the clash named", err)
	}
	twice := upstreamsYAML + strings.TrimPrefix(upstreamsYAML, "\nupstreams:\n")
	if _, err := config.Load("up.yaml", []byte(twice)); err == nil || !strings.Contains(err.Error(), `duplicate upstream "booking_com"`) {
		t.Fatalf("Load of two upstreams of one channel = %v, want the duplicate named", err)
	}
}
