package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/logbuf"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

// TestInstrumentedUnwraps: the service's metrics wrapper unwraps to the
// store it measures, so a transport over a Limiter on it still finds a
// redisstore.Store's Announcer and New does not log
// rate_announcer_missing. (transport's wrappers test covers the wrappers
// of the public packages.)
func TestInstrumentedUnwraps(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { client.Close() })
	rs, err := redisstore.New(client, redisstore.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	up := transport.Upstream{
		Channel:   "booking_com",
		Endpoints: []transport.Endpoint{{Name: "availability", Pattern: "/availability", Limits: []fleetrate.Limit{fleetrate.PerSecond(10, 1)}}},
	}
	lim, err := fleetrate.New(instrumented{Store: rs}, fleetrate.Config{Buckets: up.Buckets()})
	if err != nil {
		t.Fatal(err)
	}
	classify, err := up.Classifier()
	if err != nil {
		t.Fatal(err)
	}
	var log logbuf.Buffer
	tr, err := transport.New(lim, classify, transport.Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	if out := log.String(); strings.Contains(out, "rate_announcer_missing") {
		t.Errorf("transport.New over instrumented(redisstore) warned:\n%s", out)
	}
}
