package httplimit

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// TestPlanOnRedis serves a plan over a real Redis, whose clock decides
// the window: a yearly quota in each client's zone runs out at its count,
// the 429 states the year's end in that zone, and the usage endpoint
// reads the same use. (A run that straddles a New Year somewhere would
// see a fresh window; the test then says so.)
func TestPlanOnRedis(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client, redisstore.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	zoneOf := map[string]string{"tokyo": "Asia/Tokyo", "utc": ""}
	p := Policy{
		Name:      "api",
		Limits:    []fleetrate.Limit{fleetrate.PerSecond(100, 100)},
		Quotas:    []fleetrate.Quota{{Count: 3, Period: calendar.Period{Unit: calendar.Year}}},
		QuotaZone: func(r *http.Request) (string, error) { return zoneOf[r.Header.Get("X-API-Key")], nil },
	}
	m, err := New(Config{Store: store, Key: APIKey("X-API-Key"), LegacyHeaders: true, Timeout: 10 * time.Second, FailClosed: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := m.Limit(p)
	if err != nil {
		t.Fatal(err)
	}
	usage, err := m.UsageHandler(p)
	if err != nil {
		t.Fatal(err)
	}
	h := mw(&okHandler{})
	for key, zone := range zoneOf {
		loc, _ := time.LoadLocation(zone)
		if zone == "" {
			loc = time.UTC
		}
		start := time.Now().In(loc)
		for i, want := range []int{200, 200, 200, 429} {
			if w := do(h, key); w.Code != want {
				t.Fatalf("%s: request %d: %d %s, want %d", key, i+1, w.Code, w.Header().Get(HeaderRateLimit), want)
			}
		}
		w := do(h, key)
		end := time.Date(start.Year()+1, 1, 1, 0, 0, 0, 0, loc)
		if time.Now().After(end) {
			t.Skipf("%s: the test ran across a New Year", key)
		}
		l := rateLimit(t, w)
		retry, _ := strconv.ParseInt(w.Header().Get(HeaderRetryAfter), 10, 64)
		if l.Name != "api.year" || l.Remaining != 0 || w.Header().Get(HeaderXRateLimitReset) != strconv.FormatInt(end.Unix(), 10) ||
			time.Duration(retry)*time.Second < time.Until(end) {
			t.Errorf("%s: RateLimit %+v, Retry-After %d, X-RateLimit-Reset %s; want api.year r=0 until %v",
				key, l, retry, w.Header().Get(HeaderXRateLimitReset), end)
		}
		r := httptest.NewRequest(http.MethodGet, "/usage", nil)
		r.Header.Set("X-API-Key", key)
		uw := httptest.NewRecorder()
		usage.ServeHTTP(uw, r)
		var u UsageReport
		if err := json.Unmarshal(uw.Body.Bytes(), &u); err != nil || len(u.Quotas) != 1 || u.Quotas[0].Used != 3 || !u.Quotas[0].Reset.Equal(end) {
			t.Errorf("%s: usage %s (%v)", key, uw.Body, err)
		}
	}
}
