package server

import (
	"fmt"
	"strings"
	"testing"
)

// TestMetricDescriptorsBounded floods a detailed_metric rule with distinct
// values: the decisions counter exports at most MaxMetricDescriptors of
// them, counts the rest under descriptor="_overflow", and says how many
// it dropped. Unbounded, 200,000 client addresses made 200,000 series.
func TestMetricDescriptorsBounded(t *testing.T) {
	t.Parallel()
	ts := start(t, `
domain: d
descriptors:
  - key: ip
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 100}
`, func(o *Options) { o.MaxMetricDescriptors = 3 })
	for i := range 10 {
		ts.should(t, "d", 1, desc("ip", fmt.Sprint(i)))
		ts.should(t, "d", 1, desc("ip", fmt.Sprint(i))) // a value already seen
	}
	_, body := ts.get(t, "/metrics")
	var series int
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "fleetrate_decisions_total{") {
			series++
		}
	}
	if series != 4 {
		t.Errorf("%d decisions series, want 3 values and _overflow:\n%s", series, body)
	}
	if !strings.Contains(body, `descriptor="_overflow",domain="d",result="allowed"} 14`) {
		t.Errorf("want the 7 values beyond the bound's 14 decisions under _overflow:\n%s", body)
	}
	if !strings.Contains(body, "fleetrate_metric_descriptors_dropped_total 14") {
		t.Errorf("want 14 dropped decisions counted:\n%s", body)
	}
}
