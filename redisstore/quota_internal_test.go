package redisstore

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

// TestQuotaWindowOnTheServersClock: a client whose clock is two hours
// behind sends the windows of its clock; the script refuses them against
// Redis's TIME, and the take is sent again with the windows of the
// server's clock, which decide: the use counts in the server's hour.
func TestQuotaWindowOnTheServersClock(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(srv.Client(), Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	clientNow = func() time.Time { return time.Now().Add(-2 * time.Hour) }
	defer func() { clientNow = time.Now }()
	q := fleetrate.Quota{Count: 5, Period: calendar.Period{Unit: calendar.Hour}}
	b := fleetrate.Bucket{Key: "skewed", Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 100)}, Quotas: []fleetrate.Quota{q}}
	res, err := s.Take(t.Context(), fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	_, end := q.Period.Window(res.At)
	if !res.Allowed || res.Quotas[0].Used != 2 || !res.Quotas[0].Reset.Equal(end) || end.Sub(res.At) > time.Hour {
		t.Fatalf("%+v: want allowed, 2 used in the server's hour (ending %v)", res, end)
	}
	// The script itself refuses a window that does not hold its now.
	args := extArgs(fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1}, clientNow())
	keys, _ := s.appendQuotaKeys([]string{b.StoreKey()}, []fleetrate.Bucket{b})
	reply, err := s.eval(t.Context(), takeExtScript, keys, args...).Int64Slice()
	if err != nil || len(reply) != 2 || reply[1] != 3 {
		t.Fatalf("the script with a window two hours old: %v, %v; want {now, 3}", reply, err)
	}
}
