package config

import (
	"strings"
	"testing"
)

func TestInFlightOnBuckets(t *testing.T) {
	cfg, err := Load("f.yaml", []byte(`
buckets:
  - name: llm/requests
    rate_limit: {unit: minute, requests_per_unit: 600}
    in_flight: 8
  - name: plain
    rate_limit: {unit: second, requests_per_unit: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := cfg.Bucket("llm/requests"); b.InFlight != 8 {
		t.Errorf("llm/requests in_flight = %d, want 8", b.InFlight)
	}
	if b, _ := cfg.Bucket("plain"); b.InFlight != 0 {
		t.Errorf("plain in_flight = %d, want 0 (no bound)", b.InFlight)
	}
	for _, tc := range []struct{ value, want string }{
		{"0", "buckets[0].in_flight"},
		{"-1", "buckets[0].in_flight"},
		{"65537", "buckets[0].in_flight"},
		{"x", "buckets[0].in_flight"},
		{"1.5", "buckets[0].in_flight"},
	} {
		_, err := Load("f.yaml", []byte("buckets:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    in_flight: "+tc.value+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("in_flight %s: %v, want an error naming %s", tc.value, err, tc.want)
		}
	}
}

func TestInFlightRefusedOnRLSDescriptors(t *testing.T) {
	_, err := Load("f.yaml", []byte(`
domain: edge
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 3}
    in_flight: 2
`))
	if err == nil || !strings.Contains(err.Error(), "in_flight") || !strings.Contains(err.Error(), "RLS has no release") {
		t.Fatalf("in_flight on a descriptor: %v, want a refusal naming in_flight and why", err)
	}
}
