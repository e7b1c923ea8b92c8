package httplimit_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/httplimit"
	"github.com/fleetrate/fleetrate/memstore"
)

// A plan of 3 requests a day, resetting at midnight in Tokyo, smoothed by
// a bucket of 1 a second with a burst of 5; and the usage endpoint of the
// client's usage page. The store's clock is frozen 2 seconds before
// Tokyo's midnight, so that the output is stable.
func Example_plan() {
	frozen := time.Date(2026, 3, 2, 14, 59, 58, 0, time.UTC)
	store := memstore.New(memstore.Options{Clock: func() time.Time { return frozen }})
	m, err := httplimit.New(httplimit.Config{Store: store, Key: httplimit.APIKey("X-API-Key"), LegacyHeaders: true})
	if err != nil {
		log.Fatal(err)
	}
	tokyo, err := calendar.Parse("day Asia/Tokyo")
	if err != nil {
		log.Fatal(err)
	}
	plan := httplimit.Policy{
		Name:   "api",
		Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 5)},
		Quotas: []fleetrate.Quota{{Count: 3, Period: tokyo}},
	}
	limit, err := m.Limit(plan)
	if err != nil {
		log.Fatal(err)
	}
	usage, err := m.UsageHandler(plan)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/messages", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	mux.Handle("GET /v1/usage", usage)

	send := func(method, path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, nil)
		r.Header.Set("X-API-Key", "sk_test_123")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	fmt.Println("RateLimit-Policy:", send(http.MethodPost, "/v1/messages").Header().Get("RateLimit-Policy"))
	for range 3 {
		w := send(http.MethodPost, "/v1/messages")
		fmt.Println(w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"), w.Header().Get("X-RateLimit-Reset"))
	}
	fmt.Print(send(http.MethodGet, "/v1/usage").Body)
	// Output:
	// RateLimit-Policy: "api";q=5;w=5, "api.day";q=3
	// 201 "api.day";r=1;t=2  1772463600
	// 201 "api.day";r=0;t=2  1772463600
	// 429 "api.day";r=0;t=2 2 1772463600
	// {"policy":"api","unit":"requests","at":"2026-03-02T14:59:58Z","available":0,"limit":{"name":"api","burst":5,"used":3,"remaining":2,"reset":"2026-03-02T15:00:01Z"},"quotas":[{"name":"api.day","period":"day Asia/Tokyo","count":3,"used":3,"remaining":0,"reset":"2026-03-02T15:00:00Z"}]}
}
