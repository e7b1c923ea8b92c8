package config

import (
	"testing"
	"time"
)

// TestConfigYearLoadsUnchanged loads envoyproxy/ratelimit's yearly limits
// as its users write them: 365/year, a huge count per year, one per two
// years; each becomes a token limit whose fill time is the period.
func TestConfigYearLoadsUnchanged(t *testing.T) {
	t.Parallel()
	cfg := mustLoad(t, `domain: quota
descriptors:
  - key: plan
    value: free
    rate_limit: {unit: year, requests_per_unit: 365}
  - key: plan
    value: pro
    rate_limit: {unit: year, requests_per_unit: 4000000000}
  - key: plan
    value: audit
    rate_limit: {unit: year, unit_multiplier: 2, requests_per_unit: 1}
`)
	year := 365 * 24 * time.Hour
	for _, c := range []struct {
		value string
		burst int64
		fill  time.Duration
	}{
		{"free", 365, year},
		{"pro", 4000000000, year},
		{"audit", 1, 2 * year},
	} {
		m := cfg.Domain("quota").Match(entries("plan", c.value))
		if m.Rule == nil {
			t.Fatalf("plan %s: no rule", c.value)
		}
		l := m.Rule.Limits[0].Limit()
		if err := l.Validate(); err != nil {
			t.Fatalf("plan %s: %v", c.value, err)
		}
		// The interval is rounded up to whole µs: at most a µs a token.
		if l.Burst != c.burst || l.FillTime() < c.fill || l.FillTime() > c.fill+time.Duration(c.burst)*time.Microsecond {
			t.Errorf("plan %s: %v, fill time %v; want burst %d, fill time %v", c.value, l, l.FillTime(), c.burst, c.fill)
		}
	}
}
