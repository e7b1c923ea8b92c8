package server

import (
	"testing"
)

// The tests in this file replay, case by case, request sequences of
// envoyproxy/ratelimit's integration tests and service tests
// (test/integration, examples/ratelimit/config), with configs written for
// fleetrate. Each names the case it covers. The clock stands still, so a
// token bucket admits exactly what a fixed window does; where fleetrate
// differs on purpose the test says so (and docs/API.md lists it).

const integrationConfig = `
domain: basic
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
---
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// TestEnvoyCaseIntegrationBasic covers integration_test.go's
// testBasicBaseConfig sequence.
func TestEnvoyCaseIntegrationBasic(t *testing.T) {
	t.Parallel()
	ts := start(t, integrationConfig)

	// An unknown domain is not limited, and reports no limit.
	r := ts.should(t, "foo", 1, desc("hello", "world"))
	if r.OverallCode != ok || r.Statuses[0].Code != ok || r.Statuses[0].CurrentLimit != nil || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("unknown domain: %v, want OK with no current limit", r)
	}
	// One hit of 50/second leaves 49.
	r = ts.should(t, "basic", 1, desc("key1", "foo"))
	if st := r.Statuses[0]; r.OverallCode != ok || st.CurrentLimit.GetRequestsPerUnit() != 50 || st.LimitRemaining != 49 {
		t.Errorf("key1: %v, want OK with 49 of 50 left", r)
	}
	// 25 hits of 20/minute: 20 pass, counting down, then OVER_LIMIT with 0.
	for i := range 25 {
		r = ts.should(t, "another", 1, desc("key2", "v1"))
		code, left := ok, uint32(19-i)
		if i >= 20 {
			code, left = over, 0
		}
		if st := r.Statuses[0]; r.OverallCode != code || st.Code != code || st.LimitRemaining != left {
			t.Fatalf("key2 hit %d: %v, want %v with %d left", i+1, r, code, left)
		}
	}
	// Two descriptors: key2 (20/minute) and key3 (10/hour); the 11th
	// request is over key3's limit.
	for i := range 15 {
		r = ts.should(t, "another", 1, desc("key2", "v2"), desc("key3", "v2"))
		code, left2, left3 := ok, uint32(19-i), uint32(9-i)
		if i >= 10 {
			// fleetrate gives back what a denied request took from the other
			// descriptors (envoyproxy/ratelimit does so only with
			// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): key2 stays at 10.
			code, left2, left3 = over, 10, 0
		}
		s2, s3 := r.Statuses[0], r.Statuses[1]
		if r.OverallCode != code || s2.Code != ok || s2.LimitRemaining != left2 || s3.Code != code || s3.LimitRemaining != left3 {
			t.Fatalf("key2+key3 request %d: %v, want overall %v, key2 OK with %d, key3 %v with %d", i+1, r, code, left2, code, left3)
		}
	}
}

const quotaConfig = `
domain: rl
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: plan
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestEnvoyCaseQuotaMode covers quota_mode (examples/ratelimit/config and
// the service's quota-mode tests): an over-limit quota descriptor alone
// does not deny the request, all quota descriptors over their limits do,
// and a plain descriptor over its limit always does.
func TestEnvoyCaseQuotaMode(t *testing.T) {
	t.Parallel()
	ts := start(t, quotaConfig)
	ts.should(t, "rl", 1, desc("tenant", "a")) // spends tenant a's one hit
	r := ts.should(t, "rl", 1, desc("tenant", "a"), desc("plan", "p"))
	if r.OverallCode != ok || r.Statuses[0].Code != over || r.Statuses[1].Code != ok {
		t.Fatalf("one quota descriptor over: %v, want overall OK, statuses [OVER_LIMIT OK]", r)
	}
	ts.should(t, "rl", 1, desc("plan", "p")) // plan p is now empty too
	r = ts.should(t, "rl", 1, desc("tenant", "a"), desc("plan", "p"))
	if r.OverallCode != over {
		t.Fatalf("every quota descriptor over: %v, want OVER_LIMIT", r)
	}
	ts.should(t, "rl", 1, desc("user", "u"))
	r = ts.should(t, "rl", 1, desc("user", "u"), desc("tenant", "b"))
	if r.OverallCode != over || r.Statuses[0].Code != over {
		t.Fatalf("a plain descriptor over: %v, want OVER_LIMIT", r)
	}

	// The global QUOTA_MODE puts every descriptor in quota mode.
	g := start(t, quotaConfig, func(o *Options) { o.QuotaMode = true })
	g.should(t, "rl", 1, desc("user", "u"))
	if r := g.should(t, "rl", 1, desc("user", "u"), desc("plan", "q")); r.OverallCode != ok {
		t.Errorf("global quota mode, one of two over: %v, want OK", r)
	}
}

// TestEnvoyCaseMetadata covers metadata.yaml with
// RESPONSE_DYNAMIC_METADATA: the metadata of the rules of the descriptors
// that passed comes back as dynamic metadata, with the domain and the
// descriptors.
func TestEnvoyCaseMetadata(t *testing.T) {
	t.Parallel()
	ts := start(t, `
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: service_2
`, func(o *Options) { o.ResponseDynamicMetadata = true })
	r := ts.should(t, "test-domain", 0, desc("key1", "value1", "subkey1", "x"), desc("key2", "y"))
	m := r.DynamicMetadata.AsMap()
	if m["domain"] != "test-domain" {
		t.Errorf("domain = %v", m["domain"])
	}
	descs, _ := m["descriptors"].([]any)
	if len(descs) != 2 {
		t.Fatalf("descriptors = %v, want 2", m["descriptors"])
	}
	if e := descs[0].(map[string]any)["entries"].([]any); len(e) != 2 || e[0] != "key1=value1" || e[1] != "subkey1=x" {
		t.Errorf("entries = %v", e)
	}
	meta, _ := m["metadata"].(map[string]any)
	if meta["name"] != "service_1" || meta["service_with_quota"].(map[string]any)["name"] != "service_2" {
		t.Errorf("metadata = %v, want both rules' metadata merged", meta)
	}
	// key2 is now over its limit: its metadata is not returned.
	r = ts.should(t, "test-domain", 0, desc("key1", "value1", "subkey1", "x"), desc("key2", "y"))
	meta, _ = r.DynamicMetadata.AsMap()["metadata"].(map[string]any)
	if _, found := meta["service_with_quota"]; found || meta["name"] != "service_1" {
		t.Errorf("metadata with key2 over its limit = %v, want only service_1", meta)
	}
	// Without the option there is no dynamic metadata.
	if r := start(t, "domain: d\n").should(t, "d", 0, desc("k", "v")); r.DynamicMetadata != nil {
		t.Errorf("dynamic metadata without the option: %v", r.DynamicMetadata)
	}
}
