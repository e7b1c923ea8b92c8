package config

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/calendar"
)

// TestQuotasLoad: a descriptor and a bucket carry calendar quotas beside
// their token limits, and a rule's bucket enforces both.
func TestQuotasLoad(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `domain: api
descriptors:
  - key: plan
    value: pro
    rate_limit: {unit: second, requests_per_unit: 20, burst: 40}
    quotas:
      - {count: 10000, period: "month day=1 Europe/Paris", name: month}
      - {count: 1000, period: "day UTC+05:30"}
buckets:
  - name: llm/requests
    rate_limit: {unit: minute, requests_per_unit: 600}
    quotas: [{count: 50000, period: "week monday"}]
`)
	r := cfg.Domain("api").Match(entries("plan", "pro")).Rule
	if r == nil || len(r.Quotas) != 2 {
		t.Fatalf("rule: %+v", r)
	}
	if q := r.Quotas[0]; q.Name != "month" || q.Count != 10000 || q.Period.Unit != calendar.Month || q.Period.Location.String() != "Europe/Paris" {
		t.Errorf("quotas[0] = %+v", q)
	}
	if q := r.Quotas[1]; q.Count != 1000 || q.Period.String() != "day UTC+05:30" {
		t.Errorf("quotas[1] = %+v (%s)", q, q.Period)
	}
	e := r.Enforced(false)
	if len(e.Limits) != 1 || e.Limits[0].Burst != 40 || len(e.Quotas) != 2 || e.QuotaSpec[0] != -1 || e.QuotaSpec[1] != -1 {
		t.Errorf("Enforced = %+v", e)
	}
	b, _ := cfg.Bucket("llm/requests")
	if len(b.Quotas) != 1 || b.Quotas[0].Period.Weekday != time.Monday {
		t.Errorf("bucket quotas = %+v", b.Quotas)
	}
	if err := fleetrate.ValidateBuckets([]fleetrate.Bucket{{Key: b.Key, Limits: b.TokenLimits(), Quotas: b.Quotas}}); err != nil {
		t.Errorf("bucket does not validate: %v", err)
	}
}

// TestQuotasRefused: every bad quota is refused with an error naming its
// field (by its YAML path) and the value.
func TestQuotasRefused(t *testing.T) {
	t.Parallel()
	desc := func(quotas string) string {
		return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    quotas: " + quotas + "\n"
	}
	for _, c := range []struct {
		name, src string
		want      []string
	}{
		{"unknown zone", desc(`[{count: 1, period: "day Mars/Olympus"}]`), []string{"descriptors[0].quotas[0].period", "Mars/Olympus", "time zone"}},
		{"day 0", desc(`[{count: 1, period: "month day=0"}]`), []string{"quotas[0].period", `day "0"`}},
		{"day 32", desc(`[{count: 1, period: "month day=32 Europe/Paris"}]`), []string{"quotas[0].period", `day "32"`}},
		{"count 0", desc(`[{count: 0, period: day}]`), []string{"quotas[0].count", "got 0"}},
		{"count too large", desc(`[{count: 1125899906842625, period: day}]`), []string{"quotas[0].count", "1125899906842625"}},
		{"count overflows", desc(`[{count: 99999999999999999999, period: day}]`), []string{"quotas[0].count", "99999999999999999999"}},
		{"count missing", desc(`[{period: day}]`), []string{"quotas[0].count", "required"}},
		{"period missing", desc(`[{count: 5}]`), []string{"quotas[0].period", "required"}},
		{"unknown unit", desc(`[{count: 5, period: fortnight}]`), []string{"quotas[0].period", "fortnight"}},
		{"period twice", desc(`[{count: 5, period: day}, {count: 6, period: "day UTC"}]`), []string{"quotas[1].period", "twice"}},
		{"unknown field", desc(`[{count: 5, period: day, reset: calendar}]`), []string{"quotas[0]", "reset"}},
		{"empty", desc(`[]`), []string{"quotas", "at least one"}},
		{"not a list", desc(`{count: 5}`), []string{"quotas"}},
		{"without a limit", "domain: d\ndescriptors:\n  - key: k\n    quotas: [{count: 1, period: day}]\n", []string{"descriptors[0].quotas", "rate_limit"}},
		{"unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n    quotas: [{count: 1, period: day}]\n", []string{"descriptors[0].quotas", "unlimited"}},
		{"bucket", "buckets:\n  - name: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    quotas: [{count: 1, period: \"day Nowhere/City\"}]\n", []string{"buckets[0].quotas[0].period", "Nowhere/City"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load("test.yaml", []byte(c.src))
			if err == nil || !errors.Is(err, fleetrate.ErrInvalid) {
				t.Fatalf("Load = %v, want an ErrInvalid", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// TestEnforcedFixedWindow: with fixed windows, envoyproxy/ratelimit's
// minute, hour, day and week limits become calendar quotas of UTC (a week
// from Thursday, the epoch's weekday), and every other limit stays a
// token bucket.
func TestEnforcedFixedWindow(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 3, name: hourly}
      - {unit: hour, requests_per_unit: 5, unit_multiplier: 2}
      - {unit: day, requests_per_unit: 1000}
      - {unit: week, requests_per_unit: 5000}
      - {unit: month, requests_per_unit: 20000}
  - key: j
    rate_limit: {unit: day, requests_per_unit: 7}
    quotas: [{count: 9, period: day}]
`)
	r := cfg.Domain("d").Match(entries("k", "v")).Rule
	if e := r.Enforced(false); len(e.Quotas) != 0 || e.Limits[1].Burst != 100 {
		t.Fatalf("without fixed windows: %+v", e)
	}
	e := r.Enforced(true)
	want := []struct {
		spec   int
		period string
		count  int64
	}{{1, "minute", 100}, {2, "hour", 3}, {4, "day", 1000}, {5, "week thursday", 5000}}
	if len(e.Quotas) != len(want) {
		t.Fatalf("quotas = %v, want %d", e.Quotas, len(want))
	}
	for i, w := range want {
		if q := e.Quotas[i]; e.QuotaSpec[i] != w.spec || q.Period.String() != w.period || q.Count != w.count {
			t.Errorf("quotas[%d] = %v of spec %d, want %d/%s of spec %d", i, q, e.QuotaSpec[i], w.count, w.period, w.spec)
		}
		if l := e.Limits[w.spec]; l != PassThrough(r.Limits[w.spec].Limit().Name) {
			t.Errorf("limits[%d] = %v, want the pass-through limit", w.spec, l)
		}
	}
	if e.Quotas[1].Name != "hourly" {
		t.Errorf("the hourly quota is named %q", e.Quotas[1].Name)
	}
	for _, i := range []int{0, 3, 6} {
		if e.Limits[i] != r.Limits[i].Limit() {
			t.Errorf("limits[%d] = %v, want the token limit %v", i, e.Limits[i], r.Limits[i].Limit())
		}
	}
	b := fleetrate.Bucket{Key: "k", Limits: e.Limits, Quotas: e.Quotas}
	if err := fleetrate.ValidateBuckets([]fleetrate.Bucket{b}); err != nil {
		t.Errorf("bucket: %v", err)
	}
	// The file's day quota keeps the period: the day limit stays a token
	// bucket.
	j := cfg.Domain("d").Match(entries("j", "v")).Rule.Enforced(true)
	if len(j.Quotas) != 1 || j.Quotas[0].Count != 9 || j.QuotaSpec[0] != -1 || j.Limits[0].Burst != 7 {
		t.Errorf("rule j: %+v", j)
	}
}

// TestOperationsQuotaExamplesLoad loads the YAML examples of
// docs/OPERATIONS.md's "Calendar quotas" and "fixed windows" sections.
func TestOperationsQuotaExamplesLoad(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end := strings.Index(doc, "#### Calendar quotas"), strings.Index(doc, "#### Errors")
	if start < 0 || end < start {
		t.Fatal(`docs/OPERATIONS.md lacks its "Calendar quotas" section before "Errors"`)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(doc[start:end], -1)
	if len(blocks) != 2 {
		t.Fatalf("want 2 YAML examples, got %d", len(blocks))
	}
	for i, m := range blocks {
		cfg, err := Load("OPERATIONS.md", []byte(m[1]))
		if err != nil {
			t.Fatalf("example %d: %v", i, err)
		}
		if i == 1 && (cfg.Settings.FixedWindow == nil || !*cfg.Settings.FixedWindow) {
			t.Errorf("example %d does not set fixed_window", i)
		}
	}
}
