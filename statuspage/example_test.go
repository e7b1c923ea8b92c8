package statuspage_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/statuspage"
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
