package failsafe_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/memstore"
)

// TestLocalFallbackDividesTheInFlightBound: with the shared store down, a
// local fallback for a fleet of 4 admits 8/4 = 2 permits in flight, and a
// release there frees one.
func TestLocalFallbackDividesTheInFlightBound(t *testing.T) {
	ctx := context.Background()
	primary := &flaky{Store: memstore.New(memstore.Options{})}
	primary.down.Store(true)
	s, err := failsafe.New(primary, failsafe.Options{Policy: failsafe.LocalFallback, FleetSize: 4, Fallback: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	b := fleetrate.Bucket{Key: "cred", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, InFlight: 8}
	take := func(id string) fleetrate.Result {
		t.Helper()
		res, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, Permit: fleetrate.Permit{ID: id, TTL: time.Minute}})
		if err != nil || !res.Degraded {
			t.Fatalf("take %s: %+v, %v, want a degraded answer", id, res, err)
		}
		return res
	}
	granted := 0
	for i := range 5 {
		if take(fmt.Sprint("w", i)).Allowed {
			granted++
		}
	}
	if granted != 2 {
		t.Fatalf("the fallback granted %d permits of a shared 8 for a fleet of 4, want 2", granted)
	}
	if held, err := s.Release(ctx, []fleetrate.Bucket{b}, "w0"); err != nil || held != 1 {
		t.Fatalf("Release(w0) = %d, %v, want 1 (from the fallback)", held, err)
	}
	if !take("w9").Allowed {
		t.Fatal("after a release the fallback still refuses")
	}
}

// TestLocalFallbackDividesTheQuotas: with the shared store down, a local
// fallback for a fleet of 4 admits 100/4 = 25 of a daily quota of 100,
// and reports the quota as the shared store would.
func TestLocalFallbackDividesTheQuotas(t *testing.T) {
	ctx := context.Background()
	primary := &flaky{Store: memstore.New(memstore.Options{})}
	primary.down.Store(true)
	s, err := failsafe.New(primary, failsafe.Options{Policy: failsafe.LocalFallback, FleetSize: 4, Fallback: memstore.New(memstore.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	day, _ := calendar.Parse("day")
	b := fleetrate.Bucket{Key: "plan", Limits: []fleetrate.Limit{fleetrate.PerSecond(1000, 1000)}, Quotas: []fleetrate.Quota{{Count: 100, Period: day}}}
	granted := 0
	var last fleetrate.Result
	for range 40 {
		res, err := s.Take(ctx, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
		if err != nil || !res.Degraded {
			t.Fatalf("%+v, %v: want a degraded answer", res, err)
		}
		if res.Allowed {
			granted++
		}
		last = res
	}
	if granted != 25 || !last.QuotaDenied || last.Quotas[0].Quota.Count != 25 {
		t.Fatalf("the fallback granted %d of a shared daily 100 for a fleet of 4 (last %+v), want 25 and then the quota's refusal", granted, last)
	}
}
