package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/server/wire"
)

const usageConfig = `
buckets:
  - name: llm/requests
    rate_limit: {unit: second, requests_per_unit: 10}
    quotas: [{count: 5, period: "day", name: daily}]
---
domain: plans
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 10}
    quotas: [{count: 4, period: "month day=1 Europe/Paris", name: monthly}]
  - key: hourly
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: open
    rate_limit: {unlimited: true}
`

// getUsage sends GET /v1/usage?query with an optional bearer token and
// decodes a 200's body into a UsageView, any other's into a wire.Error.
func getUsage(t *testing.T, ts *testServer, query, token string) (int, UsageView, wire.Error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodGet, ts.url+UsagePath+"?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var (
		u UsageView
		e wire.Error
	)
	out := any(&u)
	if resp.StatusCode != http.StatusOK {
		out = &e
	}
	if err := json.Unmarshal(data, out); err != nil {
		t.Fatalf("GET %s: status %d, body %q: %v", query, resp.StatusCode, data, err)
	}
	return resp.StatusCode, u, e
}

// TestUsageOfABucket: the usage of a configured bucket states its
// tightest token limit and its quota (used, remaining, reset on the
// store's clock), takes nothing, and its available count is exactly what
// the takes that follow are granted.
func TestUsageOfABucket(t *testing.T) {
	t.Parallel()
	ts := start(t, usageConfig)
	var d Decision
	if code := ts.post(t, "/v1/take", `{"bucket":"llm/requests","n":2}`, &d); code != 200 || !d.Allowed {
		t.Fatalf("take: %d %+v", code, d)
	}
	for range 2 { // a read takes nothing: twice the same answer
		code, u, e := getUsage(t, ts, "bucket=llm/requests", "")
		if code != 200 {
			t.Fatalf("usage: %d %+v", code, e)
		}
		if u.Bucket != "llm/requests" || u.Limit == nil || u.Limit.Burst != 10 || *u.Remaining != 8 || len(u.Quotas) != 1 || u.Available != 3 {
			t.Fatalf("usage = %+v, want 8 of 10 tokens, 3 of the day's 5", u)
		}
		q := u.Quotas[0]
		midnight := time.Date(2030, 1, 2, 0, 0, 0, 0, time.UTC)
		if q.Name != "daily" || q.Count != 5 || q.Period != "day" || q.Used != 2 || q.Remaining != 3 || q.ResetUnixMicro != midnight.UnixMicro() || q.ResetAfterMS != 24*3600*1000 {
			t.Fatalf("quota = %+v", q)
		}
		if u.AtUnixMicro != ts.clock.Now().UnixMicro() {
			t.Fatalf("at = %d, want the store's clock %d", u.AtUnixMicro, ts.clock.Now().UnixMicro())
		}
	}
	granted := 0
	for range 10 {
		d = Decision{}
		if ts.post(t, "/v1/take", `{"bucket":"llm/requests"}`, &d); d.Allowed {
			granted++
		}
	}
	if code, body := ts.get(t, "/v1/config"); code != 200 || !strings.Contains(body, `"quotas":["5/day"]`) || !strings.Contains(body, `"quotas":["4/month Europe/Paris"]`) {
		t.Errorf("/v1/config does not list the quotas: %d %s", code, body)
	}
	if granted != 3 {
		t.Fatalf("%d takes granted after a usage of 3 available", granted)
	}
	// The take's answer states the quota that refused it, and its reset.
	if q := d.Quotas; d.Allowed || !d.QuotaDenied || len(q) != 1 || q[0].Bucket != "llm/requests" || q[0].Used != 5 || q[0].Remaining != 0 || d.RetryAfterMS != 24*3600*1000 {
		t.Fatalf("a take of a spent quota: %+v", d)
	}
}

// TestUsageOfADescriptor: the usage of an RLS descriptor's bucket, named
// as the request names it, after RLS takes; with fixed windows a limit
// served as a quota shows as one, with no token limit.
func TestUsageOfADescriptor(t *testing.T) {
	t.Parallel()
	ts := start(t, usageConfig, func(o *Options) { o.FixedWindow = true })
	ts.should(t, "plans", 1, desc("api_key", "k1"))
	ts.should(t, "plans", 1, desc("hourly", "x"))
	code, u, e := getUsage(t, ts, "domain=plans&key=api_key&value=k1", "")
	if code != 200 || u.Domain != "plans" || u.Rule != "plans.api_key" || len(u.Quotas) != 1 || u.Quotas[0].Used != 1 || u.Quotas[0].Remaining != 3 || u.Available != 3 || u.Limit == nil {
		t.Fatalf("usage of api_key k1: %d %+v %+v", code, u, e)
	}
	// 2030-02-01 00:00 in Paris is 2030-01-31 23:00 UTC.
	if reset := time.UnixMicro(u.Quotas[0].ResetUnixMicro).UTC(); !reset.Equal(time.Date(2030, 1, 31, 23, 0, 0, 0, time.UTC)) {
		t.Errorf("monthly reset at %v", reset)
	}
	code, u, e = getUsage(t, ts, "domain=plans&key=hourly&value=x", "")
	if code != 200 || u.Limit != nil || u.Remaining != nil || len(u.Quotas) != 1 || u.Quotas[0].Period != "hour" || u.Quotas[0].Remaining != 2 || u.Available != 2 || u.Quotas[0].ResetAfterMS != 3600*1000 {
		t.Fatalf("usage of a fixed window: %d %+v %+v", code, u, e)
	}
	if code, u, _ = getUsage(t, ts, "domain=plans&key=open", ""); code != 200 || !u.Unlimited {
		t.Fatalf("usage of an unlimited rule: %d %+v", code, u)
	}
}

// TestUsageRefusals: bad queries name what is wrong; the scope is
// decide's; a store that fails is a 503 with its error, never a usage.
func TestUsageRefusals(t *testing.T) {
	t.Parallel()
	ts := start(t, usageConfig)
	for _, c := range []struct {
		query, code, want string
	}{
		{"", wire.CodeInvalid, "required"},
		{"bucket=nope", wire.CodeUnknownBucket, "nope"},
		{"bucket=llm/requests&domain=plans", wire.CodeInvalid, "not both"},
		{"domain=plans", wire.CodeInvalid, "key"},
		{"domain=nope&key=a", wire.CodeInvalid, `"nope"`},
		{"domain=plans&key=other&value=1", wire.CodeInvalid, "no rule"},
		{"buckets=llm/requests", wire.CodeInvalid, `"buckets"`},
		{"domain=plans&key=a&value=1&value=2", wire.CodeInvalid, "2 values for 1 keys"},
	} {
		code, _, e := getUsage(t, ts, c.query, "")
		if code != http.StatusBadRequest || e.Code != c.code || !strings.Contains(e.Error, c.want) {
			t.Errorf("?%s: %d %+v, want 400 %s naming %s", c.query, code, e, c.code, c.want)
		}
	}
	if code := ts.post(t, UsagePath, `{}`, nil); code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", code)
	}

	secured := start(t, usageConfig, func(o *Options) {
		o.Access = AccessOptions{Tokens: []Token{{Secret: "dec", Scopes: ScopeDecide}, {Secret: "sto", Scopes: ScopeStore}}}
	})
	if code, _, e := getUsage(t, secured, "bucket=llm/requests", ""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d %+v", code, e)
	}
	if code, _, e := getUsage(t, secured, "bucket=llm/requests", "sto"); code != http.StatusForbidden {
		t.Errorf("a store token: %d %+v, want 403", code, e)
	}
	if code, _, e := getUsage(t, secured, "bucket=llm/requests", "dec"); code != 200 {
		t.Errorf("a decide token: %d %+v", code, e)
	}

	down := start(t, usageConfig, func(o *Options) { o.Store = failingStore{} })
	for _, q := range []string{"bucket=llm/requests", "domain=plans&key=api_key&value=k1"} {
		code, u, e := getUsage(t, down, q, "")
		if code != http.StatusServiceUnavailable || e.Code != wire.CodeStoreUnavailable || !strings.Contains(e.Error, "connection refused") || u.Quotas != nil {
			t.Errorf("?%s with the store down: %d %+v %+v, want 503 store_unavailable", q, code, e, u)
		}
	}
}

// TestRawStorePinsQuotas: the raw store API serves a configured bucket
// only with its configured quotas, so that no client takes what they do
// not count.
func TestRawStorePinsQuotas(t *testing.T) {
	t.Parallel()
	ts := start(t, usageConfig)
	bucket := func(quotas string) string {
		return `{"buckets":[{"prefix":"fleetrate:","key":"{llm}/requests","limits":[{"rate":10,"burst":10}]` + quotas + `}],"n":1}`
	}
	for _, q := range []string{``, `,"quotas":[{"count":6,"period":"day"}]`, `,"quotas":[{"count":5,"period":"day Asia/Tokyo"}]`} {
		var e wire.Error
		if code := ts.post(t, wire.TakePath, bucket(q), &e); code != http.StatusForbidden || e.Code != codePinned || !strings.Contains(e.Error, "5/day") {
			t.Errorf("raw take with quotas %q: %d %+v, want 403 %s naming the configured 5/day", q, code, e, codePinned)
		}
	}
	var res wire.Result
	if code := ts.post(t, wire.TakePath, bucket(`,"quotas":[{"count":5,"period":"day","name":"any"}]`), &res); code != 200 || !res.Allowed || len(res.Quotas) != 1 || res.Quotas[0].Used != 1 {
		t.Errorf("raw take with the configured quota: %d %+v", code, res)
	}
}
