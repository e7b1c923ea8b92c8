package fleetrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/memstore"
)

// TestConfigQuotas checks that Config.Quotas give every bucket of the
// default limits its own calendar quotas, and that bad ones are refused
// naming the field.
func TestConfigQuotas(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	s := memstore.New(memstore.Options{Clock: func() time.Time { return now }})
	day := calendar.Period{Unit: calendar.Day}
	lim, err := fleetrate.New(s, fleetrate.Config{
		Limits: []fleetrate.Limit{fleetrate.PerSecond(100, 100)},
		Quotas: []fleetrate.Quota{{Name: "day", Count: 3, Period: day}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, key := range []string{"a", "b"} {
		granted := 0
		for range 5 {
			res, err := lim.Allow(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				granted++
			} else if !res.QuotaDenied {
				t.Fatalf("key %s: a denial not by the quota: %+v", key, res)
			}
		}
		if granted != 3 {
			t.Errorf("key %s: %d granted, want the quota's 3", key, granted)
		}
		u, err := lim.Usage(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(u.Quotas) != 1 || u.Quotas[0].Used != 3 || !u.Quotas[0].Reset.Equal(time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("key %s: usage quotas %+v", key, u.Quotas)
		}
	}
	for _, tc := range []struct {
		cfg  fleetrate.Config
		want string
	}{
		{fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}, Quotas: []fleetrate.Quota{{Count: 0, Period: day}}}, "quotas[0]"},
		{fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}, Quotas: []fleetrate.Quota{{Count: 1}}}, "period"},
		{fleetrate.Config{Buckets: []fleetrate.BucketConfig{{Name: "x", Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 1)}}}, Quotas: []fleetrate.Quota{{Count: 1, Period: day}}}, "no limits"},
	} {
		_, err := fleetrate.New(s, tc.cfg)
		if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error naming %q", tc.cfg, err, tc.want)
		}
	}
}
