package statuspage_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/statuspage"
	"github.com/fleetrate/fleetrate/transport"
)

// A program mounts the page beside its own handlers; the Counter wraps
// the store its Limiter uses.
func Example() {
	counter := statuspage.NewCounter()
	store := counter.Wrap(memstore.New(memstore.Options{}))
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: []fleetrate.BucketConfig{
		{Name: "{booking_com}/availability", Limits: []fleetrate.Limit{fleetrate.PerPeriod(40, time.Hour)}},
	}})
	if err != nil {
		panic(err)
	}
	page, err := statuspage.New(statuspage.Options{
		Store:   store,
		Counter: counter,
		Buckets: statuspage.LimiterBuckets(lim, "{booking_com}/availability"),
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/status/", http.StripPrefix("/status", page)) // behind your own auth

	for range 3 {
		lim.Allow(context.Background(), "{booking_com}/availability")
	}
	st := page.Status(context.Background())
	b := st.Buckets[0]
	fmt.Printf("%s: %d decisions, %d of %d tokens left\n", b.Name, b.Decisions, b.Remaining, b.Burst)

	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest("GET", "/status/status.json", nil))
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	// Output:
	// {booking_com}/availability: 3 decisions, 37 of 40 tokens left
	// 200 application/json
}

// TransportUpstreams shows, for each endpoint of an upstream, whether the
// fleet is paused and the rate it paces the endpoint at after adaptive
// pacing, against the documented rate.
func ExampleTransportUpstreams() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer api.Close()

	// A fixed clock keeps the output exact: in use, the rate climbs back
	// to the documented one over transport.DefaultRecovery (90 s).
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Options{Clock: func() time.Time { return at }})
	up := transport.Upstream{
		Channel:   "booking_com",
		Endpoints: []transport.Endpoint{{Name: "rates", Pattern: "GET /rates", Limits: []fleetrate.Limit{fleetrate.PerSecond(4.5, 1)}}},
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		panic(err)
	}
	classify, err := up.Classifier()
	if err != nil {
		panic(err)
	}
	opts := transport.Options{MaxAttempts: 1, Logger: slog.New(slog.DiscardHandler)}
	tr, err := transport.New(lim, classify, opts)
	if err != nil {
		panic(err)
	}
	_, err = (&http.Client{Transport: tr}).Get(api.URL + "/rates")
	var gaveUp *transport.GaveUpError
	fmt.Println("rate limited:", errors.As(err, &gaveUp))

	// The same Adaptive the transports are given (opts.Adaptive).
	rows, err := statuspage.TransportUpstreams(store, "", []transport.Upstream{up}, nil, opts.Adaptive)(context.Background())
	if err != nil {
		panic(err)
	}
	for _, r := range rows {
		fmt.Printf("%s/%s: paused %v, %.2f/s of %.2f/s documented\n", r.Channel, r.Endpoint, r.PausedFor, r.EffectiveRate, r.DocumentedRate)
	}
	// Output:
	// rate limited: true
	// booking_com/rates: paused 30s, 3.83/s of 4.50/s documented
}
