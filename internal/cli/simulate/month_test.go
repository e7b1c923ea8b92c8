package simulate

import (
	"bytes"
	"image/png"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/calendar"
)

// defaultMonth is the default month run, made once for the tests that
// only read it.
var defaultMonth = sync.OnceValues(func() (*MonthReport, error) { return RunMonth(MonthConfig{}) })

func monthRun(t *testing.T) *MonthReport {
	t.Helper()
	r, err := defaultMonth()
	if err != nil {
		t.Fatalf("RunMonth: %v", err)
	}
	return r
}

func mustPeriod(t *testing.T, s string) calendar.Period {
	t.Helper()
	p, err := calendar.Parse(s)
	if err != nil {
		t.Fatalf("calendar.Parse(%q): %v", s, err)
	}
	return p
}

// TestMonthDefaults pins the run's span: 31 days from Jan 16, centred on
// Feb 1 00:00 UTC.
func TestMonthDefaults(t *testing.T) {
	t.Parallel()
	r := monthRun(t)
	if want := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC); !r.Boundary.Equal(want) {
		t.Errorf("boundary %v, want %v", r.Boundary, want)
	}
	if want := time.Date(2026, 1, 16, 0, 0, 0, 0, time.UTC); !r.From.Equal(want) {
		t.Errorf("from %v, want %v", r.From, want)
	}
	if want := time.Date(2026, 2, 16, 0, 0, 0, 0, time.UTC); !r.End.Equal(want) {
		t.Errorf("end %v, want %v", r.End, want)
	}
	names := []string{"quota+bucket", "fixed window", "bare bucket", "quota alone"}
	for i, l := range r.Limiters {
		if l.Name != names[i] {
			t.Errorf("limiter %d is %q, want %q", i, l.Name, names[i])
		}
	}
}

// TestMonthQuotaNeverExceeded: no customer is admitted more than the
// quota in any window of the period, under each limiter that has one.
func TestMonthQuotaNeverExceeded(t *testing.T) {
	t.Parallel()
	r := monthRun(t)
	for _, li := range []int{QuotaBucket, FixedWindow, QuotaAlone} {
		for ci, cu := range r.Customers {
			for start, n := range r.WindowCounts(li, ci) {
				if int64(n) > r.Config.Quota {
					t.Errorf("%s, %s: %d admitted in the window from %v, more than the quota %d", r.Limiters[li].Name, cu.Name, n, start, r.Config.Quota)
				}
			}
		}
	}
}

// TestMonthBoundaryBurst is the boundary fault: the fixed window (and the
// quota alone) admit about twice the quota across the boundary; the
// smoothing bucket never more than burst + rate × span in any span.
func TestMonthBoundaryBurst(t *testing.T) {
	t.Parallel()
	r := monthRun(t)
	c := r.Config
	b := r.CustomerIndex(Boundary)
	lo, hi := r.Boundary.Add(-c.BoundarySpan).Sub(r.From), r.Boundary.Add(c.BoundarySpan).Sub(r.From)
	for _, li := range []int{FixedWindow, QuotaAlone} {
		got := countIn(r.Limiters[li].Customers[b].Admits, lo, hi)
		// The boundary customer's daily use before the burst is the gap
		// below twice the quota: 10 a day for 16 days.
		if float64(got) < 1.95*float64(c.Quota) || int64(got) > 2*c.Quota {
			t.Errorf("%s admitted %d in the %v around the boundary, want about twice the quota %d", r.Limiters[li].Name, got, 2*c.BoundarySpan, c.Quota)
		}
	}
	for _, d := range []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour} {
		for ci, cs := range r.Limiters[QuotaBucket].Customers {
			if got, _ := maxInSpan(cs.Admits, d); float64(got) > c.BucketBound(d) {
				t.Errorf("quota+bucket, %s: %d admitted in %v, more than burst + rate × %v = %.0f", r.Customers[ci].Name, got, d, d, c.BucketBound(d))
			}
		}
	}
	if got := r.Limiters[QuotaBucket].Customers[b].MaxInMinute; got < int(c.Burst) {
		t.Errorf("quota+bucket admitted at most %d in a minute to the boundary customer, want its burst %d at least", got, c.Burst)
	}
	// The bare bucket admits its burst and its refill, no more.
	bare := c.bareLimit()
	for _, d := range []time.Duration{time.Minute, 24 * time.Hour} {
		for ci, cs := range r.Limiters[BareBucket].Customers {
			if got, _ := maxInSpan(cs.Admits, d); float64(got) > float64(bare.Burst)+bare.Rate*d.Seconds() {
				t.Errorf("bare bucket, %s: %d admitted in %v, more than its burst and refill", r.Customers[ci].Name, got, d)
			}
		}
	}
}

// TestMonthHeavyCustomer is the plan fault: the heavy customer spends the
// quota early and the quota gives it back on the 1st, whole; the bare
// bucket trickles its refill.
func TestMonthHeavyCustomer(t *testing.T) {
	t.Parallel()
	r := monthRun(t)
	h := r.CustomerIndex(Heavy)
	b := r.Boundary.Sub(r.From)
	for _, li := range []int{QuotaBucket, FixedWindow, QuotaAlone} {
		cs := r.Limiters[li].Customers[h]
		if len(cs.Denials) == 0 || cs.Denials[0] >= b {
			t.Fatalf("%s: heavy customer first refused at %v, want before the boundary %v", r.Limiters[li].Name, cs.Denials, b)
		}
		if cs.QuotaDenied != len(cs.Denials) {
			t.Errorf("%s: %d of the heavy customer's %d refusals by the quota, want all", r.Limiters[li].Name, cs.QuotaDenied, len(cs.Denials))
		}
		// The seven days from the boundary: 200 on Sunday, 5 × 1000, 200
		// on Saturday, all admitted.
		if got := countIn(cs.Admits, b, b+7*24*time.Hour); got != 5400 {
			t.Errorf("%s: heavy customer admitted %d in the week from the boundary, want all 5400", r.Limiters[li].Name, got)
		}
		if got := countIn(cs.Denials, b, b+7*24*time.Hour); got != 0 {
			t.Errorf("%s: heavy customer refused %d times in the week from the boundary, want none", r.Limiters[li].Name, got)
		}
	}
	// The bare bucket: a trickle of 10,000 per 30 days once empty.
	bare := r.Limiters[BareBucket].Customers[h]
	for _, day := range []int{25, 26, 27} { // Tue 10 to Thu 12 Feb, weekdays of 1000 requests
		if got := bare.PerDay[day]; got < 330 || got > 337 {
			t.Errorf("bare bucket: heavy customer admitted %d on %s, want its refill of 333 a day",
				got, r.DayStart(day).Format(dayFormat))
		}
	}
}

// TestMonthQuotaAloneIsTheFixedWindow: the store's calendar quota and the
// simulator's fixed window of the same period admit exactly the same
// requests, and the steady customer fits every limiter.
func TestMonthQuotaAloneIsTheFixedWindow(t *testing.T) {
	t.Parallel()
	r := monthRun(t)
	for ci, cu := range r.Customers {
		q, f := r.Limiters[QuotaAlone].Customers[ci].Admits, r.Limiters[FixedWindow].Customers[ci].Admits
		if len(q) != len(f) {
			t.Fatalf("%s: quota alone admitted %d, fixed window %d", cu.Name, len(q), len(f))
		}
		for i := range q {
			if q[i] != f[i] {
				t.Fatalf("%s: admission %d at %v (quota alone) and %v (fixed window)", cu.Name, i, q[i], f[i])
			}
		}
	}
	s := r.CustomerIndex(Steady)
	for _, l := range r.Limiters {
		if n := len(l.Customers[s].Denials); n != 0 {
			t.Errorf("%s refused the steady customer %d times", l.Name, n)
		}
	}
}

// TestMonthResetsAtTheWindowStart probes each limiter with a quota of 3
// in a zone: refused the instant before the window start, admitted at it,
// except by the bare bucket, which has no window.
func TestMonthResetsAtTheWindowStart(t *testing.T) {
	t.Parallel()
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	newYork, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Skipf("no time zone data: %v", err)
	}
	tests := []struct {
		period string
		want   time.Time
	}{
		{"month day=1", time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)},
		{"month day=1 Asia/Tokyo", time.Date(2026, 2, 1, 0, 0, 0, 0, tokyo)},           // Jan 31 15:00 UTC
		{"month day=31 America/New_York", time.Date(2026, 2, 28, 0, 0, 0, 0, newYork)}, // February is shorter
	}
	for _, tc := range tests {
		t.Run(tc.period, func(t *testing.T) {
			t.Parallel()
			cfg := MonthConfig{Period: mustPeriod(t, tc.period), Quota: 3}.withDefaults()
			_, boundary, _ := cfg.span()
			if !boundary.Equal(tc.want) {
				t.Fatalf("boundary %v, want %v", boundary, tc.want)
			}
			from := boundary.Add(-time.Hour)
			sides, err := monthSides(cfg, from)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range sides {
				steps := []struct {
					at          time.Time
					ok, byQuota bool
				}{
					{from, true, false}, {from.Add(time.Second), true, false}, {from.Add(2 * time.Second), true, false},
					// The bare bucket refuses on both sides: it refills
					// 3 per 30 days, and has no window to reset.
					{boundary.Add(-time.Nanosecond), false, s.name != "bare bucket"},
					{boundary, s.name != "bare bucket", false},
				}
				for i, st := range steps {
					ok, byQuota, err := s.decide(Heavy, st.at)
					if err != nil {
						t.Fatalf("%s step %d: %v", s.name, i, err)
					}
					if ok != st.ok || byQuota != st.byQuota {
						t.Errorf("%s at %v: allowed %v by quota %v, want %v and %v", s.name, st.at, ok, byQuota, st.ok, st.byQuota)
					}
				}
			}
		})
	}
}

// TestMonthInZone runs the scenario in Tokyo: the boundary is midnight
// there, and the boundary customer's request at that instant is
// admitted by the quota and the window after refusals just before it.
func TestMonthInZone(t *testing.T) {
	t.Parallel()
	r, err := RunMonth(MonthConfig{Period: mustPeriod(t, "month day=1 Asia/Tokyo")})
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 1, 31, 15, 0, 0, 0, time.UTC); !r.Boundary.Equal(want) {
		t.Fatalf("boundary %v, want %v", r.Boundary, want)
	}
	b, at := r.CustomerIndex(Boundary), r.Boundary.Sub(r.From)
	for _, li := range []int{FixedWindow, QuotaAlone} {
		cs := r.Limiters[li].Customers[b]
		if countIn(cs.Denials, at-r.Config.BoundarySpan, at) == 0 {
			t.Errorf("%s: no refusal of the boundary customer before the boundary", r.Limiters[li].Name)
		}
		if countIn(cs.Admits, at, at+1) != 1 {
			t.Errorf("%s: the boundary customer's request at the boundary was not admitted", r.Limiters[li].Name)
		}
	}
	for start, n := range r.WindowCounts(QuotaBucket, b) {
		if int64(n) > r.Config.Quota {
			t.Errorf("quota+bucket: %d in the window from %v", n, start)
		}
	}
	if got := r.DayStart(r.day(r.Boundary)); !got.Equal(r.Boundary) {
		t.Errorf("the boundary's day starts at %v, want the boundary %v", got, r.Boundary)
	}
}

func TestMonthValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg  MonthConfig
		want string
	}{
		{MonthConfig{Period: calendar.Period{Unit: calendar.Day}}, `period must be a month (the traffic is a month's), got "day"`},
		{MonthConfig{Period: calendar.Period{Unit: calendar.Month, Day: 32}}, "period: calendar: day: want 1 to 31, got 32"},
		{MonthConfig{Quota: -1}, "quota must be between 1 and 1000000, got -1"},
		{MonthConfig{Quota: 2_000_000}, "quota must be between 1 and 1000000, got 2000000"},
		{MonthConfig{Days: 1}, "days must be between 2 and 62, got 1"},
		{MonthConfig{Days: 100}, "days must be between 2 and 62, got 100"},
		{MonthConfig{BoundarySpan: 2 * time.Hour}, "boundary span must be between 1s and 1h, got 2h0m0s"},
		{MonthConfig{Month: "February"}, `month "February": want a year and month such as 2026-02`},
		{MonthConfig{Rate: -1}, "smoothing bucket: rate must be positive"},
		{MonthConfig{Burst: -5}, "smoothing bucket: burst must be at least 1, got -5"},
		{MonthConfig{BareBurst: 1 << 40}, "bare bucket (quota per 30 days, burst 1099511627776)"},
		{MonthConfig{Quota: 1_000_000, Days: 62}, "simulate month: 10122000 requests, more than 1000000; use a smaller quota or fewer days"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			_, err := RunMonth(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RunMonth(%+v) = %v, want an error containing %q", tc.cfg, err, tc.want)
			}
		})
	}
}

// TestMonthWriteTable checks the report's shape and its findings.
func TestMonthWriteTable(t *testing.T) {
	t.Parallel()
	r := monthRun(t)
	var b bytes.Buffer
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"centred on the quota's window start Sun 2026-02-01 00:00 UTC",
		"Sun 2026-02-01  <- boundary",
		"boundary: most admitted in any minute",
		"let the boundary customer through 1.98x the quota",
		"the bound is burst + rate x 1 min = 60",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if got := strings.Count(out, "\n2026") + strings.Count(out, " 2026-0"); got < r.Config.Days {
		t.Errorf("report has %d dated lines, want one a day at least", got)
	}
	for i, line := range strings.Split(out, "\n") {
		if strings.HasSuffix(line, " ") {
			t.Errorf("line %d ends in a blank: %q", i+1, line)
		}
	}
}

func TestMonthWriteChart(t *testing.T) {
	t.Parallel()
	r := monthRun(t)
	var b bytes.Buffer
	if err := r.WriteChart(&b, "PNG"); err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(&b); err != nil || img.Bounds().Dy() < 1000 {
		t.Fatalf("PNG chart: %v (three panels expected)", err)
	}
	b.Reset()
	if err := r.WriteChart(&b, "svg"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "quota+bucket", "bare bucket", "Heavy customer"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("SVG chart lacks %q", want)
		}
	}
	if err := r.WriteChart(&b, "gif"); err == nil || !strings.Contains(err.Error(), `got "gif"`) {
		t.Errorf("WriteChart(gif) = %v, want an error naming the format", err)
	}
}

// BenchmarkRunMonth measures a whole month's run: 31 days, three
// customers, four limiters.
func BenchmarkRunMonth(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if _, err := RunMonth(MonthConfig{}); err != nil {
			b.Fatal(err)
		}
	}
}
