package server

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetrate/fleetrate/calendar"
)

// fixedWindowConfig is envoyproxy/ratelimit's own form: nothing in it says
// "fixed window"; Options.FixedWindow does.
const fixedWindowConfig = `
domain: fixed
descriptors:
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: per_hour
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: per_day
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: per_week
    rate_limit: {unit: week, requests_per_unit: 3}
`

// wantStatus checks one descriptor status: code, current_limit's count and
// unit, limit_remaining and duration_until_reset.
func wantStatus(t *testing.T, what string, st *rlspb.RateLimitResponse_DescriptorStatus, code rlspb.RateLimitResponse_Code, limit uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, left uint32, reset time.Duration) {
	t.Helper()
	cl := st.GetCurrentLimit()
	if st.GetCode() != code || cl.GetRequestsPerUnit() != limit || cl.GetUnit() != unit || st.GetLimitRemaining() != left || st.GetDurationUntilReset().AsDuration() != reset {
		t.Fatalf("%s: %v, want %v, %d/%v, %d left, reset in %v", what, st, code, limit, unit, left, reset)
	}
}

// TestEnvoyCaseFixedWindowResetsAtTheBoundary replays
// envoyproxy/ratelimit's "resets at the boundary" sequence with
// Options.FixedWindow for each unit it serves as a calendar quota: a
// limit of 3 admits 3, refuses the 4th with the reset at the next UTC
// boundary, refuses still a second before it, and admits 3 again at the
// boundary, exactly: a token bucket would admit one. With the over-limit
// cache too, which must not hold a denial past the boundary.
func TestEnvoyCaseFixedWindowResetsAtTheBoundary(t *testing.T) {
	t.Parallel()
	for _, cache := range []int64{0, 1 << 20} {
		t.Run(fmt.Sprintf("local cache %d bytes", cache), func(t *testing.T) {
			t.Parallel()
			ts := start(t, fixedWindowConfig, func(o *Options) { o.FixedWindow, o.LocalCacheBytes = true, cache })
			fixedWindowSequences(t, ts)
		})
	}
}

// fixedWindowSequences runs the boundary sequence of each unit.
func fixedWindowSequences(t *testing.T, ts *testServer) {
	for _, c := range []struct {
		key  string
		unit rlspb.RateLimitResponse_RateLimit_Unit
		p    calendar.Period
	}{
		{"per_minute", rlspb.RateLimitResponse_RateLimit_MINUTE, calendar.Period{Unit: calendar.Minute}},
		{"per_hour", rlspb.RateLimitResponse_RateLimit_HOUR, calendar.Period{Unit: calendar.Hour}},
		{"per_day", rlspb.RateLimitResponse_RateLimit_DAY, calendar.Period{Unit: calendar.Day}},
		// envoyproxy/ratelimit's weeks are 604800 s from the epoch: from
		// Thursday 00:00 UTC.
		{"per_week", rlspb.RateLimitResponse_RateLimit_WEEK, calendar.Period{Unit: calendar.Week, Weekday: time.Thursday}},
	} {
		// Two thirds into the window, on whole seconds.
		start, end := c.p.Window(ts.clock.Now())
		ts.clock.Advance(start.Add(end.Sub(start)*2/3).Truncate(time.Second).Sub(ts.clock.Now()) + end.Sub(start))
		_, end = c.p.Window(ts.clock.Now())
		left := end.Sub(ts.clock.Now())
		for i := range 3 {
			r := ts.should(t, "fixed", 1, desc(c.key, "a"))
			wantStatus(t, c.key+" hit", r.Statuses[0], ok, 3, c.unit, uint32(2-i), left)
		}
		r := ts.should(t, "fixed", 1, desc(c.key, "a"))
		wantStatus(t, c.key+" 4th hit", r.Statuses[0], over, 3, c.unit, 0, left)
		if r.OverallCode != over {
			t.Fatalf("%s 4th hit: overall %v", c.key, r.OverallCode)
		}
		ts.clock.Advance(left - time.Second)
		r = ts.should(t, "fixed", 1, desc(c.key, "a"))
		wantStatus(t, c.key+" a second before the boundary", r.Statuses[0], over, 3, c.unit, 0, time.Second)
		ts.clock.Advance(time.Second)
		next, nextEnd := c.p.Window(ts.clock.Now())
		if !next.Equal(ts.clock.Now()) {
			t.Fatalf("%s: the clock is at %v, not the boundary %v", c.key, ts.clock.Now(), next)
		}
		for i := range 3 {
			r = ts.should(t, "fixed", 1, desc(c.key, "a"))
			wantStatus(t, c.key+" hit after the boundary", r.Statuses[0], ok, 3, c.unit, uint32(2-i), nextEnd.Sub(next))
		}
		r = ts.should(t, "fixed", 1, desc(c.key, "a"))
		wantStatus(t, c.key+" 4th hit after the boundary", r.Statuses[0], over, 3, c.unit, 0, nextEnd.Sub(next))
	}
}

// TestFixedWindowOffKeepsTokenBuckets: without the option the same file
// refills continuously (a third of the limit back after a third of the
// hour), as fleetrate does by default.
func TestFixedWindowOffKeepsTokenBuckets(t *testing.T) {
	t.Parallel()
	ts := start(t, fixedWindowConfig)
	for range 3 {
		ts.should(t, "fixed", 1, desc("per_hour", "a"))
	}
	if r := ts.should(t, "fixed", 1, desc("per_hour", "a")); r.OverallCode != over || r.Statuses[0].GetDurationUntilReset().AsDuration() != 20*time.Minute {
		t.Fatalf("4th hit: %v, want OVER_LIMIT for 20 minutes (one token)", r)
	}
}

// TestFixedWindowOverride: a descriptor's limit override of unit hour is
// a fixed window too.
func TestFixedWindowOverride(t *testing.T) {
	t.Parallel()
	ts := start(t, fixedWindowConfig, func(o *Options) { o.FixedWindow = true })
	d := desc("per_minute", "override")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	for i := range 3 {
		r := ts.should(t, "fixed", 1, d)
		code, left := ok, uint32(1-i)
		if i == 2 {
			code, left = over, 0
		}
		wantStatus(t, "override hit", r.Statuses[0], code, 2, rlspb.RateLimitResponse_RateLimit_HOUR, left, time.Hour)
	}
}

const quotaRuleConfig = `
domain: plans
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 10}
    quotas:
      - {count: 5, period: "day Asia/Tokyo", name: daily}
`

// TestDescriptorQuota: a descriptor's calendar quota is enforced with its
// token bucket in one take, and its status states the quota when it is
// the tighter: its count per day, what the day has left, and the time to
// midnight in Tokyo. A peek of a spent quota is OVER_LIMIT until then.
func TestDescriptorQuota(t *testing.T) {
	t.Parallel()
	ts := start(t, quotaRuleConfig)
	// The clock starts at 2030-01-01 00:00 UTC: 09:00 in Tokyo.
	const toMidnight = 15 * time.Hour
	day := rlspb.RateLimitResponse_RateLimit_DAY
	for i := range 5 {
		r := ts.should(t, "plans", 1, desc("api_key", "k1"))
		wantStatus(t, "hit", r.Statuses[0], ok, 5, day, uint32(4-i), toMidnight)
		if n := r.Statuses[0].GetCurrentLimit().GetName(); n != "daily" {
			t.Fatalf("current_limit named %q, want daily", n)
		}
	}
	r := ts.should(t, "plans", 1, desc("api_key", "k1"))
	wantStatus(t, "6th hit", r.Statuses[0], over, 5, day, 0, toMidnight)
	peek := desc("api_key", "k1")
	peek.HitsAddend = wrapperspb.UInt64(0)
	r = ts.should(t, "plans", 1, peek)
	wantStatus(t, "peek", r.Statuses[0], over, 5, day, 0, toMidnight)
	// Another key has its own day; its token bucket is the tighter once
	// the quota has more left than it: 6 hits at once are more than the
	// quota (5) admits, refused whatever the wait.
	r = ts.should(t, "plans", 6, desc("api_key", "k2"))
	if r.OverallCode != over {
		t.Fatalf("6 hits of a quota of 5: %v", r)
	}
	ts.clock.Advance(toMidnight)
	r = ts.should(t, "plans", 1, desc("api_key", "k1"))
	wantStatus(t, "after midnight in Tokyo", r.Statuses[0], ok, 5, day, 4, 24*time.Hour)
}

// TestFixedWindowNearLimit: a fixed window counts near-limit hits as
// envoyproxy/ratelimit does, against requests_per_unit: of ten hits of a
// limit of 10 at ratio 0.8, the 9th and the 10th.
func TestFixedWindowNearLimit(t *testing.T) {
	t.Parallel()
	ts := start(t, "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n", func(o *Options) { o.FixedWindow = true })
	for range 11 {
		ts.should(t, "edge", 1, desc("user", "u1"))
	}
	_, body := ts.get(t, "/metrics")
	m := regexp.MustCompile(`(?m)^fleetrate_near_limit_total\{descriptor="edge\.user",domain="edge"\} (\S+)$`).FindStringSubmatch(body)
	if m == nil || m[1] != "2" {
		t.Fatalf("fleetrate_near_limit_total: %v, want 2", m)
	}
}

// TestFixedWindowDeniedRequestKeepsItsCount: when one descriptor of a
// request is over its fixed window, the others' windows keep the hit, as
// envoyproxy/ratelimit counts every descriptor's hits, and their statuses
// say so truthfully.
func TestFixedWindowDeniedRequestKeepsItsCount(t *testing.T) {
	t.Parallel()
	ts := start(t, fixedWindowConfig, func(o *Options) { o.FixedWindow = true })
	for range 3 {
		ts.should(t, "fixed", 1, desc("per_day", "a"))
	}
	r := ts.should(t, "fixed", 1, desc("per_hour", "a"), desc("per_day", "a"))
	if r.OverallCode != over {
		t.Fatalf("request over the day's window: %v", r)
	}
	wantStatus(t, "per_hour beside a denial", r.Statuses[0], ok, 3, rlspb.RateLimitResponse_RateLimit_HOUR, 2, time.Hour)
	wantStatus(t, "per_day", r.Statuses[1], over, 3, rlspb.RateLimitResponse_RateLimit_DAY, 0, 24*time.Hour)
	r = ts.should(t, "fixed", 1, desc("per_hour", "a"))
	wantStatus(t, "per_hour after", r.Statuses[0], ok, 3, rlspb.RateLimitResponse_RateLimit_HOUR, 1, time.Hour)
}
