package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/server/wire"
)

const permitConfig = rlsConfig + `
buckets:
  - name: llm/requests
    rate_limit: {unit: minute, requests_per_unit: 600}
    in_flight: 2
  - name: llm/tokens
    rate_limit: {unit: hour, requests_per_unit: 100000}
  - name: solo
    rate_limit: {unit: minute, requests_per_unit: 600}
    in_flight: 1
  - name: plain
    rate_limit: {unit: second, requests_per_unit: 10}
`

// decision is the JSON of a decision, as a client in another language
// reads it.
type decision struct {
	Allowed     bool    `json:"allowed"`
	N           int64   `json:"n"`
	Remaining   int64   `json:"remaining"`
	Bucket      string  `json:"bucket"`
	AtUnixMicro int64   `json:"at_unix_micro"`
	WaitMS      float64 `json:"wait_ms"`
	Grant       string  `json:"grant"`
	SettleGrant string  `json:"settle_grant"`
	Costs       []int64 `json:"costs"`
	Buckets     []string
	InFlight    *InFlightView `json:"in_flight"`
	Permit      *PermitView   `json:"permit"`
	Code        string        `json:"code"`
	Error       string        `json:"error"`
}

func TestCostsByBucketAndSettleOnce(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig)
	var d decision
	if code := ts.post(t, "/v1/take", `{"costs":{"plain":1,"llm/tokens":60000}}`, &d); code != http.StatusOK || !d.Allowed {
		t.Fatalf("take of costs: %d %+v", code, d)
	}
	if fmt.Sprint(d.Buckets, d.Costs) != "[llm/tokens plain] [60000 1]" || d.SettleGrant == "" || d.Grant == "" {
		t.Fatalf("take of costs: buckets %v costs %v settle_grant %q, want both buckets by name with their costs and a settle grant", d.Buckets, d.Costs, d.SettleGrant)
	}
	// 40000 tokens are left: a second take of 60000 is denied, and takes
	// nothing from plain (all or nothing).
	var denied decision
	ts.post(t, "/v1/take", `{"costs":{"plain":1,"llm/tokens":60000}}`, &denied)
	if denied.Allowed || denied.Bucket != "llm/tokens" || denied.N != 60000 {
		t.Fatalf("a second take of 60000 tokens: %+v, want denied by llm/tokens", denied)
	}
	settle := fmt.Sprintf(`{"costs":{"plain":1,"llm/tokens":60000},"actual":{"plain":1,"llm/tokens":1000},"grant":%q}`, d.SettleGrant)
	var done Done
	if code := ts.post(t, "/v1/settle", settle, &done); code != http.StatusOK || !done.OK {
		t.Fatalf("settle 60000 to 1000: %d %+v", code, done)
	}
	var peek decision
	ts.post(t, "/v1/take", `{"bucket":"llm/tokens","n":0}`, &peek)
	if peek.Remaining != 99000 {
		t.Fatalf("after settling 60000 to 1000: %d left, want 99000", peek.Remaining)
	}
	var e wire.Error
	if code := ts.post(t, "/v1/settle", settle, &e); code != http.StatusForbidden || e.Code != codeGrantRefused || !strings.Contains(e.Error, "already settled") {
		t.Fatalf("a second settle of one grant: %d %+v, want 403 grant_refused, already settled", code, e)
	}
	refund := fmt.Sprintf(`{"buckets":["llm/tokens","plain"],"n":1,"grant":%q}`, d.Grant)
	if code := ts.post(t, "/v1/refund", refund, &e); code != http.StatusForbidden || e.Code != codeGrantRefused {
		t.Fatalf("a refund of a settled grant: %d %+v, want 403 grant_refused", code, e)
	}
	// A settle at the cost taken changes nothing.
	ts.post(t, "/v1/take", `{"costs":{"plain":9}}`, &d)
	more := fmt.Sprintf(`{"costs":{"plain":9},"actual":{"plain":9},"grant":%q}`, d.SettleGrant)
	if code := ts.post(t, "/v1/settle", more, &done); code != http.StatusOK {
		t.Fatalf("an even settle: %d", code)
	}
	for _, line := range []string{`fleetrate_settles_total{outcome="refunded"} 1`, `fleetrate_settles_total{outcome="refused"} 1`, `fleetrate_settles_total{outcome="even"} 1`} {
		if !metricHas(t, ts, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

func TestSettleNeedsItsGrantWithTokens(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig, func(o *Options) { o.AuthTokens = []string{"w0rker", "other"} })
	auth := []string{"Authorization", "Bearer w0rker"}
	var d decision
	ts.post(t, "/v1/take", `{"bucket":"llm/tokens","n":500}`, &d, auth...)
	if d.SettleGrant != "" {
		t.Fatalf("a take of n carries a settle grant %q; only takes of costs and acquires do", d.SettleGrant)
	}
	ts.post(t, "/v1/take", `{"costs":{"llm/tokens":500}}`, &d, auth...)
	var e wire.Error
	body := fmt.Sprintf(`{"bucket":"llm/tokens","n":500,"actual":{"llm/tokens":100},"at_unix_micro":%d}`, d.AtUnixMicro)
	if code := ts.post(t, "/v1/settle", body, &e, auth...); code != http.StatusForbidden || e.Code != codeGrantRequired || !strings.Contains(e.Error, "settle_grant") {
		t.Fatalf("a settle without its grant by a worker: %d %+v, want 403 grant_required naming settle_grant", code, e)
	}
	body = fmt.Sprintf(`{"bucket":"llm/tokens","n":500,"actual":{"llm/tokens":100},"grant":%q}`, d.SettleGrant)
	if code := ts.post(t, "/v1/settle", body, &e, "Authorization", "Bearer other"); code != http.StatusForbidden || e.Code != codeGrantRefused {
		t.Fatalf("another token's settle of the grant: %d %+v, want 403 grant_refused", code, e)
	}
	body = fmt.Sprintf(`{"bucket":"llm/tokens","n":400,"actual":{"llm/tokens":100},"grant":%q}`, d.SettleGrant)
	if code := ts.post(t, "/v1/settle", body, &e, auth...); code != http.StatusForbidden || e.Code != codeGrantRefused {
		t.Fatalf("a settle naming another cost than the take's: %d %+v, want 403 grant_refused", code, e)
	}
}

func TestAcquireRenewRelease(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig)
	ids := make([]string, 2)
	for i := range ids {
		var d decision
		if code := ts.post(t, "/v1/acquire", `{"bucket":"llm/requests"}`, &d); code != http.StatusOK || !d.Allowed || d.Permit == nil {
			t.Fatalf("acquire %d of 2: %d %+v", i+1, code, d)
		}
		if d.InFlight == nil || *d.InFlight != (InFlightView{Bucket: "llm/requests", Bound: 2, Held: int64(i + 1)}) || d.Permit.TTLMS != 15000 || len(d.Permit.ID) != 24 {
			t.Fatalf("acquire %d of 2: in_flight %+v permit %+v, want %d of 2 held, a 24-hex id, a lease of 15 s", i+1, d.InFlight, d.Permit, i+1)
		}
		ids[i] = d.Permit.ID
	}
	var d decision
	if code := ts.post(t, "/v1/acquire", `{"bucket":"llm/requests"}`, &d); code != http.StatusOK || d.Allowed || d.Permit != nil || d.InFlight.Held != 2 {
		t.Fatalf("a third acquire of 2: %d %+v, want denied with 2 held", code, d)
	}
	if code := ts.post(t, "/v1/take", `{"bucket":"llm/requests"}`, &d); code != http.StatusBadRequest || !strings.Contains(d.Error, "/v1/acquire") {
		t.Fatalf("a take without a permit from a bounded bucket: %d %+v, want 400 pointing to /v1/acquire", code, d)
	}
	var a PermitAnswer
	if ts.post(t, "/v1/renew", fmt.Sprintf(`{"bucket":"llm/requests","permit_id":%q,"ttl_ms":30000}`, ids[1]), &a); a != (PermitAnswer{Held: 1, Bounded: 1}) {
		t.Fatalf("renew of a held permit: %+v", a)
	}
	if ts.post(t, "/v1/release", fmt.Sprintf(`{"bucket":"llm/requests","permit_id":%q}`, ids[0]), &a); a.Held != 1 {
		t.Fatalf("release: %+v, want held 1", a)
	}
	if ts.post(t, "/v1/release", fmt.Sprintf(`{"bucket":"llm/requests","permit_id":%q}`, ids[0]), &a); a.Held != 0 {
		t.Fatalf("a second release: %+v, want held 0 and no error", a)
	}
	if ts.post(t, "/v1/renew", fmt.Sprintf(`{"bucket":"llm/requests","permit_id":%q}`, ids[0]), &a); !a.Lapsed {
		t.Fatalf("renew of a released permit: %+v, want lapsed", a)
	}
	if ts.post(t, "/v1/acquire", `{"bucket":"llm/requests"}`, &d); !d.Allowed {
		t.Fatalf("acquire after a release: %+v", d)
	}
	for _, line := range []string{`fleetrate_permits_held{bucket="llm/requests"} 2`, `fleetrate_permits_lapsed_total{op="release"} 1`, `fleetrate_permits_lapsed_total{op="renew"} 1`} {
		if !metricHas(t, ts, line) {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// TestAcquireOfALowerClass: an acquire with a permit_reserve leaves that
// many permits to the classes above; one of the whole bound is a 400
// naming permit_reserve.
func TestAcquireOfALowerClass(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig)
	var d decision
	if ts.post(t, "/v1/acquire", `{"bucket":"llm/requests","permit_reserve":1}`, &d); !d.Allowed {
		t.Fatalf("a bulk acquire, 0 of 2 held, 1 kept: %+v, want granted", d)
	}
	if ts.post(t, "/v1/acquire", `{"bucket":"llm/requests","permit_reserve":1}`, &d); d.Allowed {
		t.Fatalf("a second bulk acquire, 1 of 2 held, 1 kept: %+v, want denied", d)
	}
	if ts.post(t, "/v1/acquire", `{"bucket":"llm/requests"}`, &d); !d.Allowed {
		t.Fatalf("a top acquire with the kept permit free: %+v, want granted", d)
	}
	var e wire.Error
	if code := ts.post(t, "/v1/acquire", `{"bucket":"llm/requests","permit_reserve":2}`, &e); code != http.StatusBadRequest || !strings.Contains(e.Error, "permit_reserve") {
		t.Fatalf("a permit reserve of the whole bound: %d %+v, want 400 naming permit_reserve", code, e)
	}
}

// TestDeadClientsPermitComesBack drives the store's clock: a client that
// acquires and never renews nor releases loses its permit at its lease.
func TestDeadClientsPermitComesBack(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig)
	var d decision
	if ts.post(t, "/v1/acquire", `{"bucket":"solo","ttl_ms":1000}`, &d); !d.Allowed {
		t.Fatalf("first acquire: %+v", d)
	}
	ts.clock.Advance(999 * time.Millisecond)
	if ts.post(t, "/v1/acquire", `{"bucket":"solo","ttl_ms":1000}`, &d); d.Allowed {
		t.Fatalf("an acquire within the dead holder's lease: %+v, want denied", d)
	}
	ts.clock.Advance(2 * time.Millisecond)
	if ts.post(t, "/v1/acquire", `{"bucket":"solo","ttl_ms":1000}`, &d); !d.Allowed {
		t.Fatalf("an acquire after the dead holder's lease: %+v, want allowed", d)
	}
}

// TestAcquireWaitsForARelease: an acquire that may wait queues, and gets
// the permit when the holder releases it (the memory store tells).
func TestAcquireWaitsForARelease(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig)
	var held decision
	ts.post(t, "/v1/acquire", `{"bucket":"solo"}`, &held)
	got := make(chan decision, 1)
	go func() {
		var d decision
		ts.post(t, "/v1/acquire", `{"bucket":"solo","max_wait_ms":20000}`, &d)
		got <- d
	}()
	// Wait (on a condition, not a guess) until the acquire is queued.
	for !metricHas(t, ts, "fleetrate_permit_waiters 1") {
		select {
		case d := <-got:
			t.Fatalf("the waiting acquire answered before a release: %+v", d)
		case <-time.After(10 * time.Millisecond):
		}
	}
	var a PermitAnswer
	ts.post(t, "/v1/release", fmt.Sprintf(`{"bucket":"solo","permit_id":%q}`, held.Permit.ID), &a)
	if d := <-got; !d.Allowed || d.Permit == nil {
		t.Fatalf("the waiting acquire after the release: %+v, want the permit", d)
	}
}

// TestPermitsAreBoundToTheirToken: another token that learned a permit's
// id cannot release it.
func TestPermitsAreBoundToTheirToken(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig, func(o *Options) { o.AuthTokens = []string{"w0rker", "other"} })
	var d decision
	ts.post(t, "/v1/acquire", `{"bucket":"solo"}`, &d, "Authorization", "Bearer w0rker")
	var a PermitAnswer
	ts.post(t, "/v1/release", fmt.Sprintf(`{"bucket":"solo","permit_id":%q}`, d.Permit.ID), &a, "Authorization", "Bearer other")
	if a.Held != 0 {
		t.Fatalf("another token's release: %+v, want held 0", a)
	}
	if ts.post(t, "/v1/acquire", `{"bucket":"solo"}`, &d, "Authorization", "Bearer other"); d.Allowed {
		t.Fatalf("the permit after another token's release: %+v, want still held", d)
	}
}

func TestPermitAndSettleBadInput(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig)
	var ok decision
	ts.post(t, "/v1/take", `{"bucket":"llm/tokens","n":5}`, &ok)
	for _, tc := range []struct{ path, body, code, want string }{
		{"/v1/take", `{"costs":{"plain":-1}}`, wire.CodeInvalid, `costs["plain"]`},
		{"/v1/take", `{"costs":{"plain":1},"bucket":"plain"}`, wire.CodeInvalid, "costs"},
		{"/v1/take", `{"costs":{"plain":1},"n":1}`, wire.CodeInvalid, "n:"},
		{"/v1/take", `{"costs":{}}`, wire.CodeInvalid, "costs"},
		{"/v1/take", `{"costs":{"nope":1}}`, wire.CodeUnknownBucket, `"nope"`},
		{"/v1/take", `{"costs":{"plain":11}}`, wire.CodeBurstExceeded, "burst"},
		{"/v1/take", `{"costs":{"plain":"x"}}`, wire.CodeInvalidJSON, "costs"},
		{"/v1/wait", `{"costs":{"plain":1,"llm/tokens":-2}}`, wire.CodeInvalid, `costs["llm/tokens"]`},
		{"/v1/acquire", `{"bucket":"plain"}`, wire.CodeInvalid, "bounds in-flight"},
		{"/v1/acquire", `{"bucket":"solo","ttl_ms":999}`, wire.CodeInvalid, "ttl_ms"},
		{"/v1/acquire", `{"bucket":"solo","ttl_ms":3600001}`, wire.CodeInvalid, "ttl_ms"},
		{"/v1/acquire", `{"bucket":"solo","ttl_ms":-1}`, wire.CodeInvalid, "ttl_ms"},
		{"/v1/acquire", `{"bucket":"solo","max_wait_ms":-1}`, wire.CodeInvalid, "max_wait_ms"},
		{"/v1/acquire", `{"bucket":"solo","n":-1}`, wire.CodeInvalid, "n:"},
		{"/v1/acquire", `{"bucket":"solo","id":"mine"}`, wire.CodeInvalidJSON, `"id"`},
		{"/v1/acquire", `{}`, wire.CodeInvalid, "bucket"},
		{"/v1/renew", `{"bucket":"solo"}`, wire.CodeInvalid, "permit_id"},
		{"/v1/renew", `{"bucket":"solo","permit_id":"a b"}`, wire.CodeInvalid, "permit_id"},
		{"/v1/renew", `{"bucket":"solo","permit_id":"` + strings.Repeat("a", 65) + `"}`, wire.CodeInvalid, "permit_id"},
		{"/v1/renew", `{"bucket":"solo","permit_id":"abc","ttl_ms":10}`, wire.CodeInvalid, "ttl_ms"},
		{"/v1/renew", `{"bucket":"plain","permit_id":"abc"}`, wire.CodeInvalid, "bounds in-flight"},
		{"/v1/renew", `{"permit_id":"abc"}`, wire.CodeInvalid, "bucket"},
		{"/v1/release", `{"bucket":"solo","permit_id":"abc","ttl_ms":1000}`, wire.CodeInvalid, "ttl_ms"},
		{"/v1/release", `{"bucket":"nope","permit_id":"abc"}`, wire.CodeUnknownBucket, `"nope"`},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"grant":"x"}`, wire.CodeInvalid, "actual"},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"actual":{},"grant":"x"}`, wire.CodeInvalid, `actual["llm/tokens"]`},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"actual":{"llm/tokens":-1},"grant":"x"}`, wire.CodeInvalid, `actual["llm/tokens"]`},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"actual":{"llm/tokens":1,"plain":1},"grant":"x"}`, wire.CodeInvalid, `actual["plain"]`},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"actual":{"llm/tokens":100001},"grant":"x"}`, wire.CodeInvalid, "actual[0]"},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"actual":{"llm/tokens":1}}`, wire.CodeInvalid, "at_unix_micro"},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"actual":{"llm/tokens":1},"at_unix_micro":-1}`, wire.CodeInvalid, "at_unix_micro"},
		{"/v1/settle", `{"bucket":"llm/tokens","n":-5,"actual":{"llm/tokens":1},"grant":"x"}`, wire.CodeInvalid, "n:"},
		{"/v1/settle", `{"bucket":"llm/tokens","n":5,"actual":{"llm/tokens":1},"grant":"forged"}`, codeGrantRefused, "not one this service issued"},
		{"/v1/settle", fmt.Sprintf(`{"bucket":"llm/tokens","n":5,"actual":{"llm/tokens":1},"grant":%q}`, ok.Grant), codeGrantRefused, "does not match"},
		{wire.SettlePath, `{"buckets":[{"prefix":"fleetrate:","key":"k","limits":[{"rate":1,"burst":5}]}],"costs":[1],"actual":[1,2],"at_unix_micro":1}`, wire.CodeInvalid, "for 1 buckets"},
		{wire.ReleasePath, `{"buckets":[{"prefix":"fleetrate:","key":"k","limits":[{"rate":1,"burst":5}]}],"id":"x"}`, wire.CodeInvalid, "no bucket bounds"},
		{wire.RenewPath, `{"buckets":[{"prefix":"fleetrate:","key":"k","limits":[{"rate":1,"burst":5}],"in_flight":1}],"id":"x","ttl_ns":5}`, wire.CodeInvalid, "permit.ttl"},
		{wire.TakePath, `{"buckets":[{"prefix":"fleetrate:","key":"k","limits":[{"rate":1,"burst":5}],"in_flight":1}],"n":1,"permit":{"id":"","ttl_ns":1000000000}}`, wire.CodeInvalid, "permit.id"},
		{wire.TakePath, `{"buckets":[{"prefix":"fleetrate:","key":"{solo}","limits":[{"rate":10,"burst":600}],"in_flight":5}],"n":1,"permit":{"id":"x","ttl_ns":1000000000}}`, codePinned, "in_flight"},
		{wire.NotifyPath, `{"key":"fleetrate:k","id":"x","wait_ns":0}`, wire.CodeInvalid, "wait_ns"},
		{wire.NotifyPath, `{"key":"other:k","id":"x","wait_ns":1}`, wire.CodeInvalid, "prefix"},
	} {
		var e wire.Error
		code := ts.post(t, tc.path, tc.body, &e)
		if code < 400 || e.Code != tc.code || !strings.Contains(e.Error, tc.want) {
			t.Errorf("POST %s %s: %d %+v, want code %s naming %q", tc.path, tc.body, code, e, tc.code, tc.want)
		}
	}
}

// TestShutdownEndsPermitWaits: a waiting acquire answers a denial when
// the server begins to shut down, rather than hold the graceful stop for
// its max wait.
func TestShutdownEndsPermitWaits(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig, func(o *Options) { o.MaxWait = time.Minute })
	var held decision
	ts.post(t, "/v1/acquire", `{"bucket":"solo"}`, &held)
	got := make(chan decision, 1)
	go func() {
		var d decision
		ts.post(t, "/v1/acquire", `{"bucket":"solo","max_wait_ms":60000}`, &d)
		got <- d
	}()
	for !metricHas(t, ts, "fleetrate_permit_waiters 1") {
		time.Sleep(10 * time.Millisecond) // polls a condition, asserts no timing
	}
	ts.stop(t) // fails the test if Serve is held (by a wait of a minute)
	if d := <-got; d.Allowed || d.InFlight == nil || d.InFlight.Queued {
		t.Fatalf("a waiting acquire at shutdown: %+v, want a denial that left the queue", d)
	}
}

// TestWaitOfCostsThenCancel: a booking of costs by bucket is given back
// by /v1/cancel with the decision's buckets and booking.
func TestWaitOfCostsThenCancel(t *testing.T) {
	t.Parallel()
	ts := start(t, permitConfig)
	var d struct {
		decision
		Booking *wire.Booking `json:"booking"`
	}
	if ts.post(t, "/v1/wait", `{"costs":{"plain":10,"llm/tokens":100000}}`, &d); !d.Allowed || d.Booking == nil || len(d.Booking.Costs) != 2 {
		t.Fatalf("wait of costs: %+v", d)
	}
	body, _ := json.Marshal(map[string]any{"buckets": d.Buckets, "booking": d.Booking})
	var done Done
	if code := ts.post(t, "/v1/cancel", body, &done); code != http.StatusOK || !done.OK {
		t.Fatalf("cancel of a booking of costs: %d %+v", code, done)
	}
	var peek decision
	if ts.post(t, "/v1/take", `{"bucket":"llm/tokens","n":0}`, &peek); peek.Remaining != 100000 {
		t.Fatalf("after the cancel: %d tokens left, want 100000", peek.Remaining)
	}
}
