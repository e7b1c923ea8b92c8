package transport_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// TestMeterValidate: a bad meter, in-flight bound or cost by meter is
// refused with an error naming the field and the value.
func TestMeterValidate(t *testing.T) {
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 100)}
	base := func() transport.Upstream {
		return transport.Upstream{
			Channel: "llm", Credential: lim,
			Meters:    []transport.Meter{{Name: "tokens", Limits: lim}},
			Endpoints: []transport.Endpoint{{Name: "chat", Pattern: "/chat", Limits: lim, Costs: map[string]int64{"tokens": 50}}},
		}
	}
	for _, tc := range []struct {
		want   string
		change func(*transport.Upstream)
	}{
		{"credential in-flight needs credential limits", func(u *transport.Upstream) { u.CredentialInFlight, u.Credential = 2, nil }},
		{"credential in-flight: must be between 1 and 65536 (0: no bound), got -1", func(u *transport.Upstream) { u.CredentialInFlight = -1 }},
		{`endpoints[0] "chat".in_flight: must be between 1 and 65536 (0: no bound), got 65537`, func(u *transport.Upstream) { u.Endpoints[0].InFlight = 65537 }},
		{`meters[1].name: duplicate "tokens"`, func(u *transport.Upstream) { u.Meters = append(u.Meters, u.Meters[0]) }},
		{`meters[0].name: meter "a#b" must not contain '#'`, func(u *transport.Upstream) { u.Meters[0].Name = "a#b"; u.Endpoints[0].Costs = nil }},
		{`meters[0] "tokens" limits: at least one limit is required`, func(u *transport.Upstream) { u.Meters[0].Limits = nil }},
		{`endpoints[0] "chat".costs: "words" is not one of the upstream's meters`, func(u *transport.Upstream) { u.Endpoints[0].Costs = map[string]int64{"words": 1} }},
		{`endpoints[0] "chat".costs["tokens"]: must be >= 0, got -5`, func(u *transport.Upstream) { u.Endpoints[0].Costs["tokens"] = -5 }},
		{`endpoints[0] "chat".costs["tokens"]: 101 exceeds burst 100 of the meter's limits[0]`, func(u *transport.Upstream) { u.Endpoints[0].Costs["tokens"] = 101 }},
	} {
		u := base()
		if err := u.Validate(); err != nil {
			t.Fatalf("base upstream: %v", err)
		}
		tc.change(&u)
		err := u.Validate()
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v; want ErrInvalid naming %q", err, tc.want)
		}
	}
}

// TestCostFuncErrorSendsNothing: a CostFunc that fails fails the request
// before it is sent, and a target's negative cost by meter is refused.
func TestCostFuncErrorSendsNothing(t *testing.T) {
	lim := []fleetrate.Limit{fleetrate.PerSecond(10, 100)}
	up := transport.Upstream{
		Channel: "llm",
		Meters:  []transport.Meter{{Name: "tokens", Limits: lim}},
		Endpoints: []transport.Endpoint{{Name: "chat", Pattern: "/chat", Limits: lim,
			CostFunc: func(*http.Request) (map[string]int64, error) { return nil, errors.New("no max_tokens") }}},
	}
	sent := 0
	base := roundTripFunc(func(*http.Request) (*http.Response, error) { sent++; return nil, errors.New("sent") })
	tr, _ := setupOn(t, memstore.New(memstore.Options{}), up, base, transport.Options{})
	if _, err := get(t, t.Context(), tr, "/chat"); err == nil || !strings.Contains(err.Error(), "no max_tokens") || sent != 0 {
		t.Errorf("got %v after %d sends; want the cost function's error and nothing sent", err, sent)
	}
	classify := func(*http.Request) (transport.Target, error) {
		return transport.Target{Channel: "llm", Endpoint: "chat", Costs: map[string]int64{"tokens": -1}}, nil
	}
	lm, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	tr2, err := transport.New(lm, classify, transport.Options{Base: base, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, t.Context(), tr2, "/chat"); !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), `costs["tokens"]: must be >= 0, got -1`) || sent != 0 {
		t.Errorf("got %v after %d sends; want ErrInvalid naming the cost", err, sent)
	}
}
