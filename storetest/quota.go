package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
)

// quotaBucket is a bucket whose rate never binds, with quotas qs.
func quotaBucket(key string, qs ...fleetrate.Quota) fleetrate.Bucket {
	return fleetrate.Bucket{Key: key, Limits: []fleetrate.Limit{fleetrate.PerSecond(1e6, 1e6)}, Quotas: qs}
}

// daily is a quota of count a day in UTC.
func daily(count int64) fleetrate.Quota {
	return fleetrate.Quota{Name: "day", Count: count, Period: calendar.Period{Unit: calendar.Day}}
}

// quotaCounts checks that a calendar quota admits its count in a window
// and then refuses, whatever the max wait, until the window ends on the
// store's clock; that a refusal in one bucket takes nothing from another
// of the take; and that a peek reports the use.
func quotaCounts(t *testing.T, s fleetrate.Store, key func(string) string) {
	b := quotaBucket(key("{quota}used"), daily(3))
	for i := range 3 {
		res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
		if !res.Allowed || len(res.Quotas) != 1 || res.Quotas[0].Used != int64(i+1) || res.Quotas[0].Remaining != int64(2-i) {
			t.Fatalf("take %d: %+v, want allowed with %d used", i, res, i+1)
		}
	}
	for _, maxWait := range []time.Duration{0, time.Minute} {
		res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1, MaxWait: maxWait})
		_, end := daily(3).Period.Window(res.At)
		if res.Allowed || !res.QuotaDenied || res.Quota != 0 || res.Quotas[0].Remaining != 0 {
			t.Fatalf("take past the quota (max wait %v): %+v, want refused by the quota", maxWait, res)
		}
		if !res.Quotas[0].Reset.Equal(end) || res.RetryAfter != end.Sub(res.At) {
			t.Fatalf("take past the quota: reset %v, retry after %v; want the window's end %v, %v after the store's clock %v",
				res.Quotas[0].Reset, res.RetryAfter, end, end.Sub(res.At), res.At)
		}
	}
	// All or nothing: a take refused by b's quota takes nothing from other.
	other := quotaBucket(key("{quota}other"), daily(10))
	res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{other, b}, N: 1})
	if res.Allowed || !res.QuotaDenied || res.Quotas[res.Quota].Bucket != 1 {
		t.Fatalf("take from two buckets, the second's quota used up: %+v, want refused by it", res)
	}
	peek := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{other}, N: 0})
	if !peek.Allowed || peek.Quotas[0].Used != 0 {
		t.Fatalf("peek of the other bucket: %+v, want nothing used", peek)
	}
	peek = mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 0})
	if !peek.Allowed || peek.Quotas[0].Used != 3 || peek.Quotas[0].Remaining != 0 {
		t.Fatalf("peek of the used-up bucket: %+v, want 3 used, allowed (a peek takes nothing)", peek)
	}
}

// quotaChange checks that a change of a quota's count keeps what the
// window used (a plan upgraded mid-month), and a change of its period
// counts afresh.
func quotaChange(t *testing.T, s fleetrate.Store, key func(string) string) {
	k := key("plan")
	for range 3 {
		mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{quotaBucket(k, daily(3))}, N: 1})
	}
	up := quotaBucket(k, daily(5))
	for i := range 3 {
		res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{up}, N: 1})
		if want := i < 2; res.Allowed != want {
			t.Fatalf("take %d after the upgrade to 5: %+v, want allowed %v (3 used before it)", i, res, want)
		}
	}
	hourly := quotaBucket(k, fleetrate.Quota{Count: 2, Period: calendar.Period{Unit: calendar.Hour}})
	if res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{hourly}, N: 2}); !res.Allowed || res.Quotas[0].Used != 2 {
		t.Fatalf("a take under a quota of another period: %+v, want counted afresh", res)
	}
}

// quotaBoundary checks that a window ends at its boundary on the store's
// clock: an hourly quota in a zone whose hour begins about 1.5 s from now
// refuses before the boundary, with a retry-after until it, and admits
// again after it, counting afresh.
func quotaBoundary(t *testing.T, s fleetrate.Store, key func(string) string) {
	boundary := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second)
	if time.Until(boundary) < 700*time.Millisecond {
		boundary = boundary.Add(time.Second)
	}
	// Local hours begin at boundary (a zone a store can name: see
	// calendar.FixedZone).
	zone, err := calendar.FixedZone(-time.Duration(boundary.Unix()%3600) * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	q := fleetrate.Quota{Name: "hour", Count: 2, Period: calendar.Period{Unit: calendar.Hour, Location: zone}}
	b := quotaBucket(key("boundary"), q)
	mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 2})
	res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
	if res.Allowed || !res.Quotas[0].Reset.Equal(boundary) || res.RetryAfter != boundary.Sub(res.At) {
		t.Fatalf("before the boundary %v: %+v, want refused until it", boundary, res)
	}
	time.Sleep(res.RetryAfter + 50*time.Millisecond)
	res = mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
	if !res.Allowed || res.Quotas[0].Used != 1 || !res.Quotas[0].Reset.Equal(boundary.Add(time.Hour)) {
		t.Fatalf("after the boundary %v (store clock %v): %+v, want allowed in the next window", boundary, res.At, res)
	}
}

// quotaInvalid checks that bad quotas are refused, naming the field.
func quotaInvalid(t *testing.T, s fleetrate.Store, key func(string) string) {
	for _, tc := range []struct {
		name  string
		req   fleetrate.Request
		want  error
		field string
	}{
		{"count 0", fleetrate.Request{Buckets: []fleetrate.Bucket{quotaBucket(key("q"), daily(0))}, N: 1}, fleetrate.ErrInvalid, "count"},
		{"day 32", fleetrate.Request{Buckets: []fleetrate.Bucket{quotaBucket(key("q"), fleetrate.Quota{Count: 1, Period: calendar.Period{Unit: calendar.Month, Day: 32}})}, N: 1}, fleetrate.ErrInvalid, "day"},
		{"count too large", fleetrate.Request{Buckets: []fleetrate.Bucket{quotaBucket(key("q"), daily(fleetrate.MaxQuotaCount+1))}, N: 1}, fleetrate.ErrInvalid, "count"},
		{"twice the period", fleetrate.Request{Buckets: []fleetrate.Bucket{quotaBucket(key("q"), daily(1), daily(2))}, N: 1}, fleetrate.ErrInvalid, "twice"},
		{"n above the count", fleetrate.Request{Buckets: []fleetrate.Bucket{quotaBucket(key("q"), daily(2))}, N: 3}, fleetrate.ErrBurstExceeded, "quota"},
	} {
		_, err := s.Take(t.Context(), tc.req)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, err, tc.want, tc.field)
		}
	}
}

// quotaRefusedByTwo checks that a take refused by two quotas at once (a
// day's and a year's) waits for the window that ends last: a retry after
// the first one's end would be refused again.
func quotaRefusedByTwo(t *testing.T, s fleetrate.Store, key func(string) string) {
	year := fleetrate.Quota{Name: "year", Count: 1, Period: calendar.Period{Unit: calendar.Year}}
	b := quotaBucket(key("two"), daily(1), year)
	mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
	res := mustTake(t, s, fleetrate.Request{Buckets: []fleetrate.Bucket{b}, N: 1})
	_, end := year.Period.Window(res.At)
	if res.Allowed || !res.QuotaDenied || res.Quota != 1 || res.RetryAfter != end.Sub(res.At) {
		t.Fatalf("refused by a day's and a year's quota: %+v; want the year's, retry after %v", res, end.Sub(res.At))
	}
}
