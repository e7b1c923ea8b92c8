package config

import (
	"errors"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate"
)

// FuzzLoad checks that no input makes Load panic or hang, that every
// error is an ErrInvalid with a file name, and that whatever loads can be
// matched and enforced.
func FuzzLoad(f *testing.F) {
	f.Add(envoyExample)
	f.Add("domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 20, burst: 40}\n      - {unit: minute, requests_per_unit: 1000}\n")
	f.Add("buckets:\n  - {channel: booking_com, endpoint: availability, rate_limit: {unit: second, requests_per_unit: 20, burst: 40}}\n")
	f.Add("server:\n  http_addr: :8080\n  max_wait: 5s\n  response_headers: true\n")
	f.Add("domain: d\ndescriptors:\n  - &a {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n  - *a\n")
	f.Add("domain: d\n---\ndomain: e\ndescriptors: []\n")
	f.Add("domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    descriptors:\n      - key: j\n        rate_limit: {unlimited: true}\n")
	f.Add("domain: d\ndescriptors:\n  - key: k\n    value: a*b*c\n    quota_mode: yes\n    metadata: {x: [1, {y: z}]}\n    rate_limit: {unit: second, requests_per_unit: 1, key: ignored}\n")
	f.Add("buckets:\n  - {name: llm/requests, in_flight: 8, rate_limit: {unit: minute, requests_per_unit: 600}}\n")
	f.Add("domain: d\ndescriptors:\n  - {key: k, in_flight: 2, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	f.Add("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 3}\n    quotas: [{count: 10000, period: \"month day=31 Europe/Paris\", name: m}, {count: 5, period: \"day UTC+05:30\"}]\n")
	f.Add("buckets:\n  - {name: a/b, rate_limit: {unit: second, requests_per_unit: 1}, quotas: [{count: 1, period: week monday}]}\n")
	f.Add("{")
	f.Add("domain: [1, 2]\n")
	f.Add("<<: {domain: d}\n")
	f.Fuzz(func(t *testing.T, src string) {
		cfg, err := Load("fuzz.yaml", []byte(src))
		if err != nil {
			if !errors.Is(err, fleetrate.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		for _, d := range cfg.Domains {
			d.Walk(func(r *Rule) {
				if r.Unlimited || r.Denies() {
					return
				}
				for _, l := range r.TokenLimits() {
					if err := l.Validate(); err != nil {
						t.Fatalf("rule %s loaded with an invalid limit: %v", r.ID, err)
					}
				}
				for _, fixed := range []bool{false, true} {
					e := r.Enforced(fixed)
					if err := fleetrate.ValidateBuckets([]fleetrate.Bucket{{Key: "k", Limits: e.Limits, Quotas: e.Quotas}}); err != nil {
						t.Fatalf("rule %s (fixed windows %t) enforces an invalid bucket: %v", r.ID, fixed, err)
					}
				}
			})
			d.Match([]Entry{{Key: "k", Value: "v"}, {Key: "j", Value: "w"}})
		}
		for _, b := range cfg.Buckets {
			if got, ok := cfg.Bucket(b.Name); !ok || got.Key != b.Key {
				t.Fatalf("bucket %q not found by name", b.Name)
			}
			if err := fleetrate.ValidateBuckets([]fleetrate.Bucket{{Key: b.Key, Limits: b.TokenLimits(), InFlight: b.InFlight, Quotas: b.Quotas}}); err != nil {
				t.Fatalf("bucket %q loaded invalid: %v", b.Name, err)
			}
		}
	})
}
