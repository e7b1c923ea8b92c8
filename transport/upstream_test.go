package transport_test

import (
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/transport"
)

func otaUpstream() transport.Upstream {
	return transport.Upstream{
		Channel:    "booking_com",
		Credential: []fleetrate.Limit{fleetrate.PerSecond(28.5, 2)},
		Endpoints: []transport.Endpoint{
			{Name: "availability", Pattern: "POST /v1/hotels/{hotel}/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}},
			{Name: "rates", Pattern: "POST /v1/hotels/{hotel}/rates", Limits: []fleetrate.Limit{fleetrate.PerSecond(4.75, 1)}},
			{Name: "reservations", Pattern: "GET api.example.com/v1/hotels/{hotel}/reservations", Limits: []fleetrate.Limit{fleetrate.PerSecond(9.5, 2)}, Cost: 2},
		},
	}
}

func TestUpstreamBuckets(t *testing.T) {
	t.Parallel()
	var names []string
	for _, b := range otaUpstream().Buckets() {
		names = append(names, b.Name)
	}
	want := []string{
		"{booking_com}", "{booking_com}#pause",
		"{booking_com}/availability", "{booking_com}/availability#pause",
		"{booking_com}/rates", "{booking_com}/rates#pause",
		"{booking_com}/reservations", "{booking_com}/reservations#pause",
	}
	if !slices.Equal(names, want) {
		t.Errorf("Buckets() names = %q, want %q", names, want)
	}
	// They make a valid limiter configuration.
	if err := (fleetrate.Config{Buckets: otaUpstream().Buckets()}).Validate(); err != nil {
		t.Errorf("Config.Validate: %v", err)
	}
}

func TestUpstreamClassifier(t *testing.T) {
	t.Parallel()
	classify, err := otaUpstream().Classifier()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		method, url string
		endpoint    string
		cost        int64
	}{
		{"POST", "https://api.example.com/v1/hotels/7/availability", "availability", 0},
		{"POST", "http://other.example/v1/hotels/abc/rates", "rates", 0},
		{"GET", "https://api.example.com/v1/hotels/7/reservations", "reservations", 2},
		{"GET", "https://api.example.com/v1/hotels/7/availability", "", 0},
		{"GET", "https://elsewhere.example/v1/hotels/7/reservations", "", 0},
		{"POST", "https://api.example.com/v1/hotels/7/unknown", "", 0},
	}
	for _, tc := range tests {
		req, err := http.NewRequest(tc.method, tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := classify(req)
		if tc.endpoint == "" {
			if !errors.Is(err, transport.ErrNoRoute) {
				t.Errorf("%s %s: got %+v, %v; want ErrNoRoute", tc.method, tc.url, got, err)
			}
			continue
		}
		want := transport.Target{Channel: "booking_com", Endpoint: tc.endpoint, Cost: tc.cost, Credential: true}
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s %s: got %+v, %v; want %+v", tc.method, tc.url, got, err, want)
		}
	}
}

func TestUpstreamValidate(t *testing.T) {
	t.Parallel()
	ok := fleetrate.PerSecond(10, 1)
	ep := func(name, pattern string) transport.Endpoint {
		return transport.Endpoint{Name: name, Pattern: pattern, Limits: []fleetrate.Limit{ok}}
	}
	tests := []struct {
		name string
		up   transport.Upstream
		want string
	}{
		{"no channel", transport.Upstream{Endpoints: []transport.Endpoint{ep("a", "/a")}}, "channel must not be empty"},
		{"brace in channel", transport.Upstream{Channel: "x}", Endpoints: []transport.Endpoint{ep("a", "/a")}}, `channel "x}"`},
		{"no endpoints", transport.Upstream{Channel: "c"}, "endpoints: at least one is required"},
		{"bad credential limit", transport.Upstream{Channel: "c", Credential: []fleetrate.Limit{{Rate: -1, Burst: 1}}, Endpoints: []transport.Endpoint{ep("a", "/a")}}, "credential[0]: rate must be positive"},
		{"empty endpoint name", transport.Upstream{Channel: "c", Endpoints: []transport.Endpoint{ep("", "/a")}}, "endpoints[0].name: endpoint must not be empty"},
		{"duplicate endpoint", transport.Upstream{Channel: "c", Endpoints: []transport.Endpoint{ep("a", "/a"), ep("a", "/b")}}, `endpoints[1].name: duplicate "a"`},
		{"empty pattern", transport.Upstream{Channel: "c", Endpoints: []transport.Endpoint{ep("a", "")}}, "endpoints[0].pattern: must not be empty"},
		{"no limits", transport.Upstream{Channel: "c", Endpoints: []transport.Endpoint{{Name: "a", Pattern: "/a"}}}, "endpoints[0].limits: at least one limit is required"},
		{"bad limit", transport.Upstream{Channel: "c", Endpoints: []transport.Endpoint{{Name: "a", Pattern: "/a", Limits: []fleetrate.Limit{{Rate: 1, Burst: 0}}}}}, "endpoints[0].limits[0]: burst must be at least 1"},
		{"cost above burst", transport.Upstream{Channel: "c", Endpoints: []transport.Endpoint{{Name: "a", Pattern: "/a", Cost: 3, Limits: []fleetrate.Limit{ok}}}}, "cost: 3 exceeds burst 1"},
		{"drain credential without one", transport.Upstream{Channel: "c", DrainCredential: true, Endpoints: []transport.Endpoint{ep("a", "/a")}}, "drain credential needs credential limits"},
		{"cost above credential burst", transport.Upstream{Channel: "c", Credential: []fleetrate.Limit{ok}, Endpoints: []transport.Endpoint{{Name: "a", Pattern: "/a", Cost: 2, Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 5)}}}}, "cost: 2 exceeds burst 1 of credential[0]"},
		{"negative cost", transport.Upstream{Channel: "c", Endpoints: []transport.Endpoint{{Name: "a", Pattern: "/a", Cost: -1, Limits: []fleetrate.Limit{ok}}}}, "endpoints[0].cost: must be >= 0, got -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.up.Validate()
			if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want ErrInvalid mentioning %q", err, tc.want)
			}
			if _, err := tc.up.Classifier(); err == nil {
				t.Error("Classifier() accepted an invalid upstream")
			}
		})
	}
}

func TestUpstreamBadPatternsAreErrors(t *testing.T) {
	t.Parallel()
	lim := []fleetrate.Limit{fleetrate.PerSecond(1, 1)}
	for _, tc := range []struct {
		name      string
		endpoints []transport.Endpoint
		want      string
	}{
		{"malformed", []transport.Endpoint{{Name: "a", Pattern: "POST /x/{", Limits: lim}}, "endpoints[0].pattern"},
		{"conflicting", []transport.Endpoint{{Name: "a", Pattern: "/x/{id}", Limits: lim}, {Name: "b", Pattern: "/x/{name}", Limits: lim}}, "endpoints[1].pattern"},
	} {
		_, err := transport.Upstream{Channel: "c", Endpoints: tc.endpoints}.Classifier()
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Classifier() = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}
