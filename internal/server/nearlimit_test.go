package server

import (
	"regexp"
	"testing"

	"github.com/fleetrate/fleetrate"
)

// TestNearLimitHits holds nearLimitHits to envoyproxy/ratelimit's
// near_limit arithmetic, with its limit of 10 and ratio 0.8 (threshold
// 8), "used" being the burst less the tokens left.
func TestNearLimitHits(t *testing.T) {
	t.Parallel()
	lim := fleetrate.PerSecond(10, 10)
	for _, c := range []struct {
		name      string
		allowed   bool
		remaining int64 // after a grant; as it was for a denial
		hits      int64
		want      int64
	}{
		{"grant well below the threshold", true, 5, 1, 0},
		{"grant up to the threshold", true, 2, 1, 0},
		{"grant just above it", true, 1, 1, 1},
		{"grant of the last token", true, 0, 1, 1},
		{"grant across the threshold", true, 0, 4, 2}, // used 6 -> 10: 9 and 10 are near
		{"grant all above it", true, 0, 2, 2},
		{"denial from below the threshold", false, 5, 6, 2}, // envoy: limit - max(near, before) = 10 - 8
		{"denial from above it", false, 1, 2, 1},            // 10 - 9
		{"denial of an empty bucket", false, 0, 1, 0},
		{"peek", true, 0, 0, 0},
	} {
		res := fleetrate.Result{Allowed: c.allowed, Remaining: c.remaining, Limit: lim}
		if got := nearLimitHits(res, c.hits, 0.8); got != c.want {
			t.Errorf("%s: %d near-limit hits, want %d", c.name, got, c.want)
		}
	}
}

// TestNearLimitMetric: ten one-hit requests on a limit of 10 take the
// bucket from 0 to 10 in use; the 9th and the 10th are above 80 %, and
// the 11th, denied from an empty bucket, adds nothing.
func TestNearLimitMetric(t *testing.T) {
	t.Parallel()
	ts := start(t, `
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	for range 11 {
		ts.should(t, "edge", 1, desc("user", "u1"))
	}
	_, body := ts.get(t, "/metrics")
	m := regexp.MustCompile(`(?m)^fleetrate_near_limit_total\{descriptor="edge\.user",domain="edge"\} (\S+)$`).FindStringSubmatch(body)
	if m == nil || m[1] != "2" {
		t.Fatalf("fleetrate_near_limit_total: %v, want 2 in\n%s", m, regexp.MustCompile(`(?m)^fleetrate_near.*$`).FindAllString(body, -1))
	}
}
