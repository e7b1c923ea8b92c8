package config

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
)

// envoyExample is written in envoyproxy/ratelimit's format only, using
// every field that format knows.
const envoyExample = `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day to one number
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    detailed_metric: true
    rate_limit:
      name: per_number
      unit: day
      requests_per_unit: 100
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: ldap
    rate_limit:
      unlimited: true
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit:
          requests_per_unit: 10
          unit: SECOND
  - key: path
    value: /api/*
    value_to_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: tenant
    value: team-*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 30
  - key: user
    value: bkthomps
    rate_limit:
      replaces:
        - name: per_number
      unit: hour
      requests_per_unit: 7
`

func mustLoad(t *testing.T, src string) *Config {
	t.Helper()
	cfg, err := Load("test.yaml", []byte(src))
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return cfg
}

func entries(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

func TestEnvoyFormatLoadsUnchanged(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, envoyExample)
	d := cfg.Domain("messaging")
	if d == nil {
		t.Fatal("domain messaging not loaded")
	}
	if got, want := d.Rules, 9; got != want {
		t.Errorf("rules = %d, want %d", got, want)
	}
	m := d.Match(entries("message_type", "marketing", "to_number", "2061111111"))
	if m.Rule == nil {
		t.Fatal("nested descriptor did not match")
	}
	l := m.Rule.Limits[0]
	if l.RequestsPerUnit != 5 || l.Unit != Day || l.Burst != 5 {
		t.Errorf("limit = %+v, want 5/day burst 5", l)
	}
	tl := l.Limit()
	if tl.Burst != 5 || tl.Rate != 5.0/86400 {
		t.Errorf("token limit = %v, want rate 5/86400 burst 5", tl)
	}
	if m.Rule.ID != "messaging.message_type_marketing.to_number" {
		t.Errorf("ID = %q", m.Rule.ID)
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	d := mustLoad(t, envoyExample).Domain("messaging")
	tests := []struct {
		name    string
		entries []Entry
		rule    string // "" means no rule
		key     string
		metric  string
	}{
		{"key only", entries("remote_address", "50.0.0.1"), "messaging.remote_address", "rls:messaging:remote_address=50.0.0.1", "messaging.remote_address"},
		{"value before key", entries("remote_address", "50.0.0.5"), "messaging.remote_address_50.0.0.5", "rls:messaging:remote_address=50.0.0.5", "messaging.remote_address_50.0.0.5"},
		{"unknown key", entries("nope", "x"), "", "", ""},
		{"too deep", entries("remote_address", "1", "extra", "2"), "", "", ""},
		{"too shallow", entries("message_type", "marketing"), "", "", ""},
		{"placeholder without limit", entries("service", "auth"), "", "", ""},
		{"nested key only", entries("service", "auth", "user", "user-a"), "messaging.service.user_user-a", "rls:messaging:service=auth|user=user-a", "messaging.service.user_user-a"},
		{"detailed metric", entries("to_number", "206"), "messaging.to_number", "rls:messaging:to_number=206", "messaging.to_number_206"},
		{"wildcard value to metric", entries("path", "/api/v1"), "messaging.path_/api/*", "rls:messaging:path=/api/v1", "messaging.path_/api/v1"},
		{"wildcard no match", entries("path", "/web"), "", "", ""},
		{"share threshold shares the bucket", entries("tenant", "team-blue"), "messaging.tenant_team-*", "rls:messaging:tenant=team-*", "messaging.tenant_team-*"},
		{"escaped key", entries("remote_address", "a|b=c:{d}"), "messaging.remote_address", "rls:messaging:remote_address=a%7Cb%3Dc%3A%7Bd%7D", "messaging.remote_address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := d.Match(tt.entries)
			if tt.rule == "" {
				if m.Rule != nil {
					t.Fatalf("matched %q, want no rule", m.Rule.ID)
				}
				return
			}
			if m.Rule == nil {
				t.Fatalf("no rule, want %q", tt.rule)
			}
			if m.Rule.ID != tt.rule || m.Key != tt.key || m.Metric != tt.metric {
				t.Errorf("got (%q, %q, %q), want (%q, %q, %q)", m.Rule.ID, m.Key, m.Metric, tt.rule, tt.key, tt.metric)
			}
		})
	}
}

func TestRuleFlags(t *testing.T) {
	t.Parallel()
	d := mustLoad(t, envoyExample).Domain("messaging")
	if r := d.Match(entries("ldap", "x")).Rule; r == nil || !r.Unlimited {
		t.Errorf("ldap: want unlimited, got %+v", r)
	}
	if r := d.Match(entries("remote_address", "50.0.0.5")).Rule; r == nil || !r.Denies() {
		t.Errorf("50.0.0.5: want a denying rule, got %+v", r)
	}
	if r := d.Match(entries("service", "s", "user", "user-a")).Rule; r == nil || !r.ShadowMode {
		t.Errorf("user-a: want shadow mode, got %+v", r)
	}
	if r := d.Match(entries("user", "bkthomps")).Rule; r == nil || len(r.Replaces) != 1 || r.Replaces[0] != "per_number" {
		t.Errorf("bkthomps: want replaces [per_number], got %+v", r)
	}
	if r := d.Match(entries("to_number", "1")).Rule; r == nil || r.Name != "per_number" {
		t.Errorf("to_number: want name per_number, got %+v", r)
	}
}

func TestExtensions(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `
domain: api
descriptors:
  - key: api_key
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 20, burst: 40}
      - {unit: minute, requests_per_unit: 1000}
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 6, unit_multiplier: 10, burst: 2}
---
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: second, requests_per_unit: 20, burst: 40}
  - name: booking_com
    rate_limits:
      - {unit: second, requests_per_unit: 50}
  - name: expedia/v2/search
    rate_limit: {unit: minute, requests_per_unit: 600}
server:
  http_addr: ":9090"
  max_wait: 2s
  response_headers: true
  redis_batch: false
  adaptive_procs: false
  max_request_bytes: 4096
  metrics_addr: "127.0.0.1:9102"
  tls_http: false
  quota_mode: true
  memory_max_keys: 5000
  local_cache_bytes: 0
  near_limit_ratio: 0.5
`)
	r := cfg.Domain("api").Match(entries("api_key", "k")).Rule
	if r == nil || len(r.Limits) != 2 {
		t.Fatalf("api_key: want two limits, got %+v", r)
	}
	if got := r.TokenLimits(); got[0] != (fleetrate.Limit{Name: "per_second", Rate: 20, Burst: 40}) || got[1].Burst != 1000 {
		t.Errorf("limits = %v", got)
	}
	slow := cfg.Domain("api").Match(entries("slow", "x")).Rule.Limits[0]
	if slow.Period() != 10*time.Minute || slow.Limit().Rate != 0.01 || slow.Burst != 2 {
		t.Errorf("slow = %+v (period %v, limit %v)", slow, slow.Period(), slow.Limit())
	}
	tests := []struct{ name, key string }{
		{"booking_com/availability", "{booking_com}/availability"},
		{"{booking_com}/availability", "{booking_com}/availability"},
		{"booking_com", "{booking_com}"},
		{"expedia/v2/search", "{expedia}/v2/search"},
	}
	for _, tt := range tests {
		b, ok := cfg.Bucket(tt.name)
		if !ok || b.Key != tt.key {
			t.Errorf("Bucket(%q) = %+v, %v; want key %q", tt.name, b, ok, tt.key)
		}
	}
	if _, ok := cfg.Bucket("nope"); ok {
		t.Error("unknown bucket found")
	}
	s := cfg.Settings
	if s.HTTPAddr == nil || *s.HTTPAddr != ":9090" || s.MaxWait == nil || *s.MaxWait != 2*time.Second ||
		s.ResponseHeaders == nil || !*s.ResponseHeaders || s.MaxRequestBytes == nil || *s.MaxRequestBytes != 4096 || s.GRPCAddr != nil ||
		s.RedisBatch == nil || *s.RedisBatch || s.AdaptiveProcs == nil || *s.AdaptiveProcs {
		t.Errorf("settings = %+v", s)
	}
	if s.MetricsAddr == nil || *s.MetricsAddr != "127.0.0.1:9102" || s.TLSHTTP == nil || *s.TLSHTTP || s.QuotaMode == nil || !*s.QuotaMode ||
		s.MemoryMaxKeys == nil || *s.MemoryMaxKeys != 5000 || s.LocalCacheBytes == nil || *s.LocalCacheBytes != 0 ||
		s.NearLimitRatio == nil || *s.NearLimitRatio != 0.5 || s.HealthChecksStore != nil || s.MetricsPath != nil {
		t.Errorf("settings = %+v", s)
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, src, want string
	}{
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
			`test.yaml:5: descriptors[0].rate_limit.unit: unknown unit "fortnight"`},
		{"unknown field", "domain: d\ndescriptors:\n  - key: k\n    rate_limt: {unit: second}\n",
			`test.yaml:4: descriptors[0].rate_limt: unknown field`},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n",
			`test.yaml:3: descriptors[0].key: must not be empty`},
		{"missing domain", "descriptors:\n  - key: k\n", `domain: must not be empty`},
		{"duplicate descriptor", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
			`test.yaml:4: descriptors[1]: duplicate descriptor "d.k" (first on line 3)`},
		{"duplicate limit name", "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {name: sec, unit: second, requests_per_unit: 5}\n      - {name: sec, unit: minute, requests_per_unit: 50}\n",
			`test.yaml:6: descriptors[0].rate_limits[1].name: duplicate limit name "sec" (first in rate_limits[0])`},
		{"near limit ratio above 1", "server:\n  near_limit_ratio: 1.5\n",
			`test.yaml:2: server.near_limit_ratio: must be a number above 0 and at most 1, got "1.5"`},
		{"memory max keys zero", "server:\n  memory_max_keys: 0\n",
			`test.yaml:2: server.memory_max_keys: must be between 1 and 9223372036854775807, got 0`},
		{"merge domains is a flag only", "server:\n  merge_domains: true\n",
			`server.merge_domains: unknown field`},
		{"negative rpu", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			`descriptors[0].rate_limit.requests_per_unit: must be between 0 and 4294967295, got -1`},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
			`rate_limit.unit: must not be given when unlimited is true`},
		{"burst zero", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, burst: 0}\n",
			`rate_limit.burst: must be between 1`},
		{"fill time", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, unit_multiplier: 3, requests_per_unit: 5}\n",
			`descriptors[0].rate_limit: 5/3year: burst/rate (time to fill) must be at most`},
		{"not a number", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: lots}\n",
			`requests_per_unit: must be a whole number, got "lots"`},
		{"bad yaml", "domain: d\ndescriptors: [\n", `test.yaml:2: invalid YAML`},
		{"duplicate domain", "domain: d\n---\ndomain: d\n", `duplicate domain "d"`},
		{"bucket braces", "buckets:\n  - channel: '{x}'\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			`buckets[0].channel: must not contain { or }`},
		{"bucket no limit", "buckets:\n  - channel: x\n", `buckets[0]: needs rate_limit or rate_limits`},
		{"duplicate bucket", "buckets:\n  - {name: a/b, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {channel: a, endpoint: b, rate_limit: {unit: second, requests_per_unit: 1}}\n",
			`test.yaml:3: buckets[1]: duplicate bucket "a/b" (first on line 2)`},
		{"server duration", "server:\n  max_wait: soon\n", `test.yaml:2: server.max_wait: must be a duration`},
		{"server unknown", "server:\n  port: 1\n", `test.yaml:2: server.port: unknown field`},
		{"share threshold without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			`share_threshold: needs a wildcard value`},
		{"duplicate key", "domain: d\ndomain: e\n", `test.yaml:2: domain: given twice`},
		{"not a mapping", "- 1\n- 2\n", `must be a mapping`},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}\n",
			`cannot replace itself`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load("test.yaml", []byte(tt.src))
			if err == nil {
				t.Fatalf("Load succeeded, want error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error:\n%v\nwant it to contain %q", err, tt.want)
			}
			if !errors.Is(err, fleetrate.ErrInvalid) {
				t.Errorf("error does not wrap ErrInvalid")
			}
		})
	}
}

func TestEmptyAndCommentsOnly(t *testing.T) {
	t.Parallel()
	for _, src := range []string{"", "# nothing\n", "---\n---\n"} {
		cfg := mustLoad(t, src)
		if len(cfg.Domains) != 0 || len(cfg.Buckets) != 0 {
			t.Errorf("%q: loaded %v", src, cfg)
		}
	}
}

// TestAliasBomb feeds a document whose aliases would expand to 9^29
// descriptors: Load must still return at once.
func TestAliasBomb(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - &a0 {key: k0, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for i := 1; i < 30; i++ {
		b.WriteString("  - &a" + strconv.Itoa(i) + " {key: k" + strconv.Itoa(i) + ", descriptors: [")
		for j := 0; j < 9; j++ {
			b.WriteString("*a" + strconv.Itoa(i-1) + ", ")
		}
		b.WriteString("]}\n")
	}
	done := make(chan error, 1)
	go func() {
		_, err := Load("bomb.yaml", []byte(b.String()))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "duplicate descriptor") {
			t.Errorf("err = %v, want duplicate descriptor errors", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Load did not return on an alias bomb")
	}
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "fleetrate.yaml")
	if err := os.WriteFile(path, []byte(envoyExample), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Path != path || cfg.Domain("messaging") == nil {
		t.Errorf("LoadFile = %+v", cfg)
	}
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml")); !errors.Is(err, fleetrate.ErrInvalid) {
		t.Errorf("missing file: err = %v, want ErrInvalid", err)
	}
	if _, err := LoadFile(dir); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("directory: err = %v", err)
	}
}

func TestUnitNames(t *testing.T) {
	t.Parallel()
	for name, u := range unitNames {
		if got, ok := ParseUnit(strings.ToUpper(name)); !ok || got != u || u.String() != name || u.Duration() == 0 {
			t.Errorf("unit %q: ParseUnit = %v, %v; String = %q", name, got, ok, u.String())
		}
	}
	if _, ok := ParseUnit("fortnight"); ok {
		t.Error("fortnight parsed")
	}
}

// TestMisspeltFieldIsTheOnlyError: a misspelt requests_per_unit is the
// one error reported; the burst beside it is not blamed for a
// requests_per_unit the file did give.
func TestMisspeltFieldIsTheOnlyError(t *testing.T) {
	t.Parallel()
	_, err := Load("test.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_uint: 5, burst: 10}\n"))
	if err == nil || !strings.Contains(err.Error(), "requests_per_uint: unknown field") || strings.Count(err.Error(), "test.yaml:") != 1 {
		t.Fatalf("err = %v, want the unknown field as the one error", err)
	}
}
