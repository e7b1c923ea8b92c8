package transport_test

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// Pace a fleet's calls to an OTA: every worker that builds its client this
// way over the same store shares the documented limits.
func Example() {
	ota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	defer ota.Close()

	upstream := transport.Upstream{
		Channel:    "booking_com",
		Credential: []fleetrate.Limit{fleetrate.PerSecond(28, 1)}, // 30/s documented
		Endpoints: []transport.Endpoint{
			{Name: "availability", Pattern: "POST /v1/hotels/{hotel}/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}},
			{Name: "reservations", Pattern: "GET /v1/hotels/{hotel}/reservations", Limits: []fleetrate.Limit{fleetrate.PerSecond(9, 1)}},
		},
	}
	limiter, err := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: upstream.Buckets()})
	if err != nil {
		panic(err)
	}
	classify, err := upstream.Classifier()
	if err != nil {
		panic(err)
	}
	rt, err := transport.New(limiter, classify, transport.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: rt}

	for range 3 {
		resp, err := client.Post(ota.URL+"/v1/hotels/7/availability", "application/json", strings.NewReader(`{"rooms":3}`))
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	_, err = client.Get(ota.URL + "/v1/unknown")
	fmt.Println(errors.Is(err, transport.ErrNoRoute))
	// Output:
	// 200 OK
	// 200 OK
	// 200 OK
	// true
}

func ExampleParseRetryAfter() {
	now := time.Date(2025, 3, 14, 12, 0, 0, 0, time.UTC)
	for _, v := range []string{"2", "Fri, 14 Mar 2025 12:00:30 GMT", "Fri, 14 Mar 2025 11:00:00 GMT", "86400", "-1", "soon", ""} {
		d, ok := transport.ParseRetryAfter(v, now, time.Minute)
		fmt.Printf("%q: %v %v\n", v, d, ok)
	}
	// Output:
	// "2": 2s true
	// "Fri, 14 Mar 2025 12:00:30 GMT": 30s true
	// "Fri, 14 Mar 2025 11:00:00 GMT": 0s true
	// "86400": 1m0s true
	// "-1": 0s false
	// "soon": 0s false
	// "": 0s false
}

func ExampleUpstream_Buckets() {
	up := transport.Upstream{
		Channel:    "booking_com",
		Credential: []fleetrate.Limit{fleetrate.PerSecond(28, 1)},
		Endpoints: []transport.Endpoint{
			{Name: "availability", Pattern: "/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}},
		},
	}
	for _, b := range up.Buckets() {
		fmt.Println(b.Name, b.Limits[0])
	}
	// Output:
	// {booking_com} 28/s burst 1
	// {booking_com}#pause pause 1e+09/s burst 1099511627776
	// {booking_com}/availability 19/s burst 1
	// {booking_com}/availability#pause pause 1e+09/s burst 1099511627776
}

// A request that stays rate limited ends in a *GaveUpError, which a
// scheduler can tell from an upstream failure.
func ExampleGaveUpError() {
	ota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer ota.Close()

	up := transport.Upstream{Channel: "expedia", Endpoints: []transport.Endpoint{
		{Name: "rates", Pattern: "/rates", Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 1)}},
	}}
	limiter, _ := fleetrate.New(memstore.New(memstore.Options{}), fleetrate.Config{Buckets: up.Buckets()})
	classify, _ := up.Classifier()
	rt, _ := transport.New(limiter, classify, transport.Options{
		MaxAttempts: 3,
		Backoff:     func(int, time.Duration, time.Duration) time.Duration { return 0 },
		Logger:      slog.New(slog.DiscardHandler),
	})
	_, err := (&http.Client{Transport: rt}).Get(ota.URL + "/rates")
	var gaveUp *transport.GaveUpError
	if errors.As(err, &gaveUp) {
		fmt.Println(gaveUp.Attempts, gaveUp.StatusCode, errors.Is(err, transport.ErrGaveUp))
	}
	// Output:
	// 3 429 true
}

// Declare a strict window, one request per 50 ms and no burst: the fleet
// paces below it, and every request also passes the fleet's spacing gate
// just before it goes out. Pacing at the window's own rate is refused.
func ExampleEndpoint_spacing() {
	window := 50 * time.Millisecond
	up := transport.Upstream{
		Channel: "payments",
		Endpoints: []transport.Endpoint{
			{Name: "charge", Pattern: "POST /v1/charges", Spacing: window, Limits: []fleetrate.Limit{fleetrate.PerSecond(19, 1)}},
		},
	}
	fmt.Println("19/s:", up.Validate())
	fmt.Println("gate margin:", transport.SpacingMargin(window))

	up.Endpoints[0].Limits = []fleetrate.Limit{fleetrate.Every(window, 1)}
	fmt.Println("20/s:", up.Validate())
	// Output:
	// 19/s: <nil>
	// gate margin: 1ms
	// 20/s: fleetrate: invalid: upstream "payments": endpoints[0].limits[0]: rate 20/s is faster than spacing 50ms lets through (at most 19.61/s: one request per spacing + 1ms, its margin)
}
