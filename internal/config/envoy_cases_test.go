package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate"
)

// The tests in this file cover, case by case, the configuration test cases
// of envoyproxy/ratelimit (its test/config/*.yaml and the example config
// under examples/ratelimit/config), with configs written for fleetrate. Each
// test names the case it covers.

// TestEnvoyCaseAccepted loads a file for each case envoyproxy/ratelimit
// accepts; fleetrate must accept it too.
func TestEnvoyCaseAccepted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		envoyCase string
		src       string
	}{
		{"basic_config.yaml", `
domain: shop
descriptors:
  - key: region
    value: eu
    descriptors:
      - key: shopper
        rate_limit: {unit: second, requests_per_unit: 3}
      - key: shopper
        value: vip
        rate_limit: {unit: second, requests_per_unit: 30}
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 40}
  - key: client
    value: partner
  - key: cron
    rate_limit: {name: cron_limit, unit: day, requests_per_unit: 2}
  - key: internal
    rate_limit: {unlimited: true}
  - key: ua
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 9}
`},
		{"metadata.yaml", `
domain: shop
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 40}
    metadata:
      team: payments
      limits: {tier: 2, tags: [a, b], on: true}
`},
		{"examples/ratelimit/config/example.yaml: quota_mode", `
domain: shop
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100}
`},
		{"shadowmode_config.yaml", `
domain: shop
descriptors:
  - key: client
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 40}
`},
		{"share_threshold.yaml: middle and multiple wildcards", `
domain: shop
descriptors:
  - key: route
    value: /v*/orders
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: rpc
    value: svc*ep*call
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`},
		{"a field envoyproxy/ratelimit accepts anywhere but ignores here", `
domain: shop
descriptors:
  - key: client
    unit: minute
    rate_limit: {unit: minute, requests_per_unit: 40, key: x}
`},
		{"YAML 1.1 booleans", `
domain: shop
descriptors:
  - key: client
    shadow_mode: yes
    rate_limit: {unit: minute, requests_per_unit: 40}
`},
	}
	for _, tt := range tests {
		t.Run(tt.envoyCase, func(t *testing.T) {
			t.Parallel()
			mustLoad(t, tt.src)
		})
	}
}

// TestEnvoyCaseRejected loads a file for each case envoyproxy/ratelimit
// rejects; fleetrate rejects it too, naming the file, the line and the
// field.
func TestEnvoyCaseRejected(t *testing.T) {
	t.Parallel()
	tests := []struct {
		envoyCase, src, want string
	}{
		{"bad_limit_unit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n",
			`test.yaml:5: descriptors[0].rate_limit.unit: unknown unit "fortnight"`},
		{"bad_yaml.yaml", "'''\n", `test.yaml:2: invalid YAML: found unexpected end of stream`},
		{"duplicate_key.yaml", "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
			`test.yaml:5: descriptors[1]: duplicate descriptor "d.k_v" (first on line 3)`},
		{"empty_domain.yaml", "descriptors:\n", `test.yaml:1: domain: must not be empty`},
		{"empty_key.yaml", "domain: d\ndescriptors:\n  - value: v\n", `test.yaml:3: descriptors[0].key: must not be empty`},
		{"misspelled_key.yaml", "domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: day\n",
			`test.yaml:4: descriptors[0].ratelimit: unknown field`},
		{"misspelled_key2.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			`test.yaml:6: descriptors[0].rate_limit.requestsperunit: unknown field`},
		{"non_map_list.yaml", "domain: d\ndescriptors:\n  - a\n  - b\n", `test.yaml:3: descriptors[0]: must be a mapping`},
		{"non_string_key.yaml", "0.25: d\ndescriptors:\n", `test.yaml:1: 0.25: unknown field`},
		{"replaces_empty.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      replaces:\n        - name:\n      unit: second\n      requests_per_unit: 5\n",
			`test.yaml:7: descriptors[0].rate_limit.replaces[0].name: must not be empty`},
		{"replaces_self.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      replaces:\n        - name: me\n      unit: second\n      requests_per_unit: 5\n",
			`test.yaml:5: descriptors[0].rate_limit.replaces: a rule cannot replace itself ("me")`},
		{"unlimited_with_unit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n",
			`test.yaml:6: descriptors[0].rate_limit.unit: must not be given when unlimited is true`},
		{"share_threshold without a wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
			`test.yaml:3: descriptors[0].share_threshold: needs a wildcard value`},
		{"metadata that is not a mapping", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: [1]\n",
			`test.yaml:5: descriptors[0].metadata: must be a mapping`},
	}
	for _, tt := range tests {
		t.Run(tt.envoyCase, func(t *testing.T) {
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

// TestEnvoyCaseWildcard covers wildcard.yaml and share_threshold.yaml:
// prefix ("foo*"), middle ("bar*b") and multiple ("foo*bar*baz")
// wildcards, each '*' matching any run of bytes, the empty one included;
// an exact value wins over a wildcard; share_threshold makes every
// matching value share one bucket.
func TestEnvoyCaseWildcard(t *testing.T) {
	t.Parallel()
	d := mustLoad(t, `
domain: d
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: suffix
    value: '*.jpg'
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
`).Domain("d")
	tests := []struct {
		name    string
		entries []Entry
		rule    string // "" means no rule applies
		key     string
		metric  string
	}{
		{"prefix matches", entries("wild", "foo1"), "d.wild_foo*", "rls:d:wild=foo1", "d.wild_foo*"},
		{"prefix matches the empty rest", entries("wild", "foo"), "d.wild_foo*", "rls:d:wild=foo", "d.wild_foo*"},
		{"prefix does not match another value", entries("wild", "bar"), "", "", ""},
		{"no eager match without '*'", entries("noWild", "foo1"), "", "", ""},
		{"middle matches", entries("midWild", "barab"), "d.midWild_bar*b", "rls:d:midWild=barab", "d.midWild_bar*b"},
		{"middle matches barXb", entries("midWild", "barXb"), "d.midWild_bar*b", "rls:d:midWild=barXb", "d.midWild_bar*b"},
		{"middle matches the empty middle", entries("midWild", "barb"), "d.midWild_bar*b", "rls:d:midWild=barb", "d.midWild_bar*b"},
		{"middle needs the suffix", entries("midWild", "bara"), "", "", ""},
		{"middle needs the prefix", entries("midWild", "xbarb"), "", "", ""},
		{"prefix and suffix may not overlap", entries("midWild", "bar"), "", "", ""},
		{"multiple wildcards", entries("multiWild", "foo123bar456baz"), "d.multiWild_foo*bar*baz", "rls:d:multiWild=foo123bar456baz", "d.multiWild_foo*bar*baz"},
		{"multiple wildcards, empty runs", entries("multiWild", "foobarbaz"), "d.multiWild_foo*bar*baz", "rls:d:multiWild=foobarbaz", "d.multiWild_foo*bar*baz"},
		{"multiple wildcards need every part", entries("multiWild", "foo123baz"), "", "", ""},
		{"multiple wildcards need the prefix", entries("multiWild", "bar456baz"), "", "", ""},
		{"multiple wildcards in order", entries("multiWild", "foobazbarbaz"), "d.multiWild_foo*bar*baz", "rls:d:multiWild=foobazbarbaz", "d.multiWild_foo*bar*baz"},
		{"suffix wildcard", entries("suffix", "cat.jpg"), "d.suffix_*.jpg", "rls:d:suffix=cat.jpg", "d.suffix_*.jpg"},
		{"nested wildcard", entries("nestedWild", "val1", "wild", "goo2"), "d.nestedWild_val1.wild_goo*", "rls:d:nestedWild=val1|wild=goo2", "d.nestedWild_val1.wild_goo*"},
		{"exact value wins over a wildcard", entries("file", "test1"), "d.file_test1", "rls:d:file=test1", "d.file_test1"},
		{"share_threshold shares one bucket", entries("file", "test2"), "d.file_test*", "rls:d:file=test*", "d.file_test*"},
		{"share_threshold with a middle wildcard", entries("midpath", "/api/orders/v1"), "d.midpath_/api*v1", "rls:d:midpath=/api*v1", "d.midpath_/api*v1"},
		{"share_threshold nested middle wildcards", entries("tenant", "t1prod", "resource", "res9v2"), "d.tenant_t*prod.resource_res*v2", "rls:d:tenant=t*prod|resource=res*v2", "d.tenant_t*prod.resource_res*v2"},
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

// TestEnvoyCaseQuotaModeAndMetadata covers metadata.yaml and the example
// config's quota_mode: both are kept on the rule for the server to honour.
func TestEnvoyCaseQuotaModeAndMetadata(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `
domain: d
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100}
    metadata:
      service_with_quota: {name: service_2, tier: 2}
  - key: spare
    quota_mode: true
    metadata: {name: x}
`)
	r := cfg.Domain("d").Match(entries("tenant", "t1")).Rule
	if r == nil || !r.QuotaMode {
		t.Fatalf("tenant: want a quota_mode rule, got %+v", r)
	}
	got := r.Metadata.GetFields()["service_with_quota"].GetStructValue().GetFields()
	if got["name"].GetStringValue() != "service_2" || got["tier"].GetNumberValue() != 2 {
		t.Errorf("metadata = %v, want service_with_quota {name: service_2, tier: 2}", r.Metadata)
	}
	// Without rate_limit both have no effect, which is said once.
	if len(cfg.Notices) != 2 {
		t.Fatalf("notices = %v, want 2 (quota_mode and metadata without rate_limit)", cfg.Notices)
	}
	for _, n := range cfg.Notices {
		if n.Line == 0 || !strings.Contains(n.Msg, "no effect without rate_limit") {
			t.Errorf("notice %q: want a line and the reason", n)
		}
	}
}

func TestWildcardMatch(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true},
		{"*", "anything", true},
		{"a*", "a", true},
		{"*a", "ba", true},
		{"a*a", "a", false},
		{"a*a", "aa", true},
		{"a**b", "ab", true},
		{"a*b*c", "abbc", true},
		{"a*b*c", "acb", false},
		{"a*bc*bc", "abcbc", true},
		{"a*bc*bc", "abc", false},
		{"x", "x", true},
	}
	for _, tt := range tests {
		if got := wildcardMatch(strings.Split(tt.pattern, "*"), tt.value); got != tt.want {
			t.Errorf("wildcardMatch(%q, %q) = %v, want %v", tt.pattern, tt.value, got, tt.want)
		}
	}
}
