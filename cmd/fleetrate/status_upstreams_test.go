package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/statuspage"
	"github.com/fleetrate/fleetrate/transport"
)

// TestUpstreamEffectiveRateInABrowser loads a status page whose endpoint
// a 429 slowed in headless Chromium and checks the effective rate column
// it renders: shown, marked lowered, with its share of the documented
// rate; and hidden when adaptive pacing is off.
func TestUpstreamEffectiveRateInABrowser(t *testing.T) {
	bin := chromium(t)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Options{Clock: func() time.Time { return at }}) // frozen: the penalty does not decay
	up := transport.Upstream{
		Channel:    "booking_com",
		Credential: []fleetrate.Limit{fleetrate.PerSecond(30, 30)},
		Endpoints: []transport.Endpoint{
			{Name: "availability", Pattern: "POST /a", Limits: []fleetrate.Limit{fleetrate.PerSecond(18, 1)}},
			{Name: "rates", Pattern: "POST /r", Limits: []fleetrate.Limit{fleetrate.PerSecond(4.5, 1)}},
		},
	}
	// The fleet's effective rate, as a 429 leaves it: 0.7 of the
	// documented rate, 90/128 rounded up.
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := lim.Bucket(transport.EndpointBucket("booking_com", "availability"))
	if err != nil {
		t.Fatal(err)
	}
	if err := transport.SetEffectiveFactor(context.Background(), store, b, transport.Adaptive{}, 0.7); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		adaptive transport.Adaptive
		hidden   bool
	}{
		{"adaptive", transport.Adaptive{}, false},
		{"off", transport.Adaptive{Off: true}, true},
	} {
		page, err := statuspage.New(statuspage.Options{
			Store: store, Buckets: func() []statuspage.Bucket { return nil },
			Upstreams: statuspage.TransportUpstreams(store, "", []transport.Upstream{up}, nil, tc.adaptive),
		})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(page)
		dom := runChromium(t, bin, srv.URL+"/", "", 3*time.Second)
		srv.Close()

		table := dom[strings.Index(dom, `<table id="upstreams"`):]
		table = table[:strings.Index(table, ">")]
		if got := strings.Contains(table, "hidden-col"); got != tc.hidden {
			t.Errorf("%s: effective rate column hidden = %v (%s), want %v", tc.name, got, table, tc.hidden)
		}
		if tc.hidden {
			continue
		}
		for endpoint, want := range map[string]string{
			"availability": "12.66/s (70 %); credential 30.00/s (100 %)", // 18 × 90/128
			"rates":        "4.50/s (100 %); credential 30.00/s (100 %)",
		} {
			if got := domRow(t, dom, "upstream", "booking_com/"+endpoint)["effective_rate"]; got != want {
				t.Errorf("%s: %s effective rate cell = %q, want %q", tc.name, endpoint, got, want)
			}
		}
		if !strings.Contains(dom, `<td class="n eff lowered" data-field="effective_rate">12.66/s`) {
			t.Errorf("%s: the lowered rate is not marked lowered:\n%s", tc.name, dom)
		}
	}
}
