package config

import "testing"

// BenchmarkLoad measures parsing a file that uses every kind of block:
// nested descriptors, rate_limits, buckets and a server section.
func BenchmarkLoad(b *testing.B) {
	src := []byte(`
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}
    descriptors:
      - key: path
        value: /send
        rate_limits:
          - {unit: minute, requests_per_unit: 100, name: per-minute}
          - {unit: hour, requests_per_unit: 1000}
  - key: ip
    value: "*"
    share_threshold: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: free
    rate_limit: {unlimited: true}
---
buckets:
  - name: api/send
    rate_limit: {unit: second, requests_per_unit: 5}
  - channel: sms
    endpoint: bulk
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: day, requests_per_unit: 1000}
server:
  max_wait: 5s
  response_headers: true
  max_request_bytes: 65536
`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load("bench.yaml", src); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMatch measures matching a two-entry descriptor, the RLS hot
// path: a value match and then a wildcard.
func BenchmarkMatch(b *testing.B) {
	cfg, err := Load("bench.yaml", []byte(`
domain: api
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: path
        value: /send*
        rate_limit: {unit: second, requests_per_unit: 10}
`))
	if err != nil {
		b.Fatal(err)
	}
	d := cfg.Domain("api")
	entries := []Entry{{Key: "tenant", Value: "acme"}, {Key: "path", Value: "/send/sms"}}
	b.ReportAllocs()
	for b.Loop() {
		if d.Match(entries).Rule == nil {
			b.Fatal("no match")
		}
	}
}
