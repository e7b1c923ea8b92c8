package simulate

import (
	"bytes"
	"fmt"
	"image/png"
	"strings"
	"testing"
	"time"
)

func run(t *testing.T, cfg Config) *Report {
	t.Helper()
	r, err := Run(cfg)
	if err != nil {
		t.Fatalf("Run(%+v): %v", cfg, err)
	}
	return r
}

// TestDoubleQuotaSpike is the issue's boundary scenario: a client spends
// its whole quota in the 10 s before 12:01:00 and again in the 10 s
// after. The fixed window admits twice its quota within 20 s; the token
// bucket never more than burst + rate × 20 s.
func TestDoubleQuotaSpike(t *testing.T) {
	t.Parallel()
	r := run(t, Config{})
	c := r.Config
	if c.Quota != 600 || c.Rate != 10 || c.Burst != 20 || c.Span != 20*time.Second {
		t.Fatalf("defaults changed: %+v", c)
	}
	if got, want := r.Fixed.BoundaryMaxInSpan, int(2*c.Quota); got != want {
		t.Errorf("fixed window admitted %d to the boundary client in 20 s, want %d (twice the quota)", got, want)
	}
	if r.Fixed.BoundaryAdmitted != int(2*c.Quota) {
		t.Errorf("fixed window admitted %d of the boundary client's %d requests, want all", r.Fixed.BoundaryAdmitted, 2*c.Quota)
	}
	bound := c.BucketBound(c.Span) // 20 + 10 × 20 = 220
	if got := r.Bucket.BoundaryMaxInSpan; float64(got) > bound || got < 219 {
		t.Errorf("token bucket admitted %d to the boundary client in 20 s, want 219..%.0f", got, bound)
	}
	if got := r.Bucket.BoundaryAdmitted; got != r.Bucket.BoundaryMaxInSpan {
		t.Errorf("boundary client admitted %d in all, %d in its best 20 s; all of it is within 20 s", got, r.Bucket.BoundaryMaxInSpan)
	}
	// Second by second: the fixed window passes its 60/s, the bucket its
	// burst and then exactly its rate.
	for s := 50; s < 70; s++ {
		if got := r.Fixed.BoundaryPerSecond[s]; got != 60 {
			t.Errorf("fixed window, boundary client, second %d: %d admitted, want 60", s, got)
		}
		want := 10
		if s == 50 {
			want = 29 // burst of 20, plus 9 refills before 12:00:51
		}
		if got := r.Bucket.BoundaryPerSecond[s]; got != want {
			t.Errorf("token bucket, boundary client, second %d: %d admitted, want %d", s, got, want)
		}
	}
}

// TestBurstEqualToQuota gives the bucket the fixed window's own numbers
// (600 per minute as rate 10/s with burst 600): even then no 20 s span
// sees twice the quota.
func TestBurstEqualToQuota(t *testing.T) {
	t.Parallel()
	r := run(t, Config{Burst: 600, CronClients: -1})
	if got := r.Fixed.BoundaryMaxInSpan; got != 1200 {
		t.Errorf("fixed window: %d, want 1200", got)
	}
	got, bound := r.Bucket.BoundaryMaxInSpan, r.Config.BucketBound(20*time.Second)
	if float64(got) > bound || got >= 1200 {
		t.Errorf("token bucket: %d in 20 s, want at most %.0f", got, bound)
	}
	if got < 790 {
		t.Errorf("token bucket: %d in 20 s, want about 800 (its burst is the whole quota)", got)
	}
}

// TestCronStampede checks the per-second peaks: the fixed window lets all
// ten cron batches through in the :00 second; the bucket admits each
// client's burst and then spreads the rest at its rate, with every cron
// request admitted in the end under both.
func TestCronStampede(t *testing.T) {
	t.Parallel()
	r := run(t, Config{Boundary: -1})
	if got := r.Fixed.PeakPerSecond; got != 1000 {
		t.Errorf("fixed window peak %d/s, want 1000 (10 clients × 100 at once)", got)
	}
	for _, s := range []int{0, 60, 120} {
		if got := r.Fixed.PerSecond[s]; got != 1000 {
			t.Errorf("fixed window second %d: %d, want 1000", s, got)
		}
		if got := r.Bucket.PerSecond[s]; got != 200 {
			t.Errorf("token bucket second %d: %d, want 200 (10 bursts of 20)", s, got)
		}
		for d := 1; d <= 8; d++ {
			if got := r.Bucket.PerSecond[s+d]; got != 100 {
				t.Errorf("token bucket second %d: %d, want 100 (10 clients × 10/s)", s+d, got)
			}
		}
	}
	if got := r.Bucket.PeakPerSecond; got != 200 {
		t.Errorf("token bucket peak %d/s, want 200", got)
	}
	if r.Fixed.Admitted != 3000 || r.Bucket.Admitted != 3000 {
		t.Errorf("admitted %d (fixed) and %d (bucket), want all 3000 cron requests", r.Fixed.Admitted, r.Bucket.Admitted)
	}
	if r.Fixed.Rejected != 0 {
		t.Errorf("fixed window rejected %d", r.Fixed.Rejected)
	}
	// Refusals are retried after Retry-After = 1 s: 80+70+...+10 per batch.
	if got, want := r.Bucket.Rejected, 10*3*360; got != want {
		t.Errorf("token bucket rejected %d, want %d", got, want)
	}
}

// TestFixedWindowSendsEveryoneBackAtZero overloads the fixed window: what
// it refuses it sends back at the next :00, where the next stampede is.
func TestFixedWindowSendsEveryoneBackAtZero(t *testing.T) {
	t.Parallel()
	r := run(t, Config{Boundary: -1, CronClients: 2, CronBatch: 700, Duration: 2 * time.Minute})
	for s, n := range r.Fixed.PerSecond {
		if n > 0 && s%60 != 0 {
			t.Errorf("fixed window admitted %d at second %d; all its admissions should fall on :00", n, s)
		}
	}
	if got := r.Fixed.PerSecond[60]; got != 2*600 {
		t.Errorf("fixed window at 12:01:00: %d, want both clients' full quota of 600", got)
	}
	if got := r.Fixed.Rejected; got != 2*(100+200) {
		t.Errorf("fixed window rejected %d, want 100 per client at 12:00:00 and 200 (the returning 100 too) at 12:01:00", got)
	}
	if r.Bucket.PeakPerSecond > 2*(20+10) {
		t.Errorf("token bucket peak %d/s exceeds 2 clients × (burst + rate)", r.Bucket.PeakPerSecond)
	}
}

func TestMaxInSpan(t *testing.T) {
	t.Parallel()
	s := time.Second
	tests := []struct {
		times []time.Duration
		want  int
		at    time.Duration
	}{
		{nil, 0, 0},
		{[]time.Duration{0}, 1, 0},
		{[]time.Duration{0, 19 * s, 20 * s}, 2, 0},
		{[]time.Duration{0, 5 * s, 21 * s, 22 * s, 24 * s}, 4, 5 * s},
		{[]time.Duration{0, 5 * s, 25 * s, 26 * s}, 2, 0},
		{[]time.Duration{s, s, s}, 3, s},
	}
	for _, tt := range tests {
		got, at := maxInSpan(tt.times, 20*s)
		if got != tt.want || at != tt.at {
			t.Errorf("maxInSpan(%v) = %d at %v, want %d at %v", tt.times, got, at, tt.want, tt.at)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{Duration: 2 * time.Hour}, "duration"},
		{Config{Window: 500 * time.Millisecond}, "window"},
		{Config{Window: 1500 * time.Millisecond}, "whole seconds"},
		{Config{Quota: -1}, "quota"},
		{Config{Rate: -1}, "rate"},
		{Config{Burst: -1}, "burst"},
		{Config{CronClients: 5000}, "cron clients"},
		{Config{CronBatch: -3}, "cron batch"},
		{Config{Boundary: 10 * time.Minute}, "boundary"},
		{Config{BoundarySpan: 2 * time.Minute}, "boundary span"},
		{Config{Span: time.Millisecond}, "span"},
	} {
		if _, err := Run(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Run(%+v) error %v, want one naming %q", tt.cfg, err, tt.want)
		}
	}
}

func TestMaxEvents(t *testing.T) {
	t.Parallel()
	// 1000 clients × 100000 at every :00 for an hour is far too many; the
	// run is refused before anything is allocated.
	_, err := Run(Config{Duration: time.Hour, CronClients: 1000, CronBatch: 100_000, Boundary: -1})
	if err == nil || !strings.Contains(err.Error(), "more than 5000000") {
		t.Errorf("huge simulation: %v, want the event cap", err)
	}
}

func TestRetryStormIsBounded(t *testing.T) {
	t.Parallel()
	cfg := Config{CronClients: 1, CronBatch: 5000, Boundary: -1}.withDefaults()
	tb, err := newTokenBucket(Start, cfg.Rate, cfg.Burst)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := play(cfg, "token bucket", tb, 20_000); err == nil || !strings.Contains(err.Error(), "more than 20000") {
		t.Errorf("retry storm: %v, want the event cap", err)
	}
}

func TestWriteChart(t *testing.T) {
	t.Parallel()
	r := run(t, Config{})
	var b bytes.Buffer
	if err := r.WriteChart(&b, "png"); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatalf("chart is not a PNG: %v", err)
	}
	if w := img.Bounds().Dx(); w < 800 {
		t.Errorf("chart is %d px wide", w)
	}
	full := img.Bounds().Dy()
	b.Reset()
	if err := run(t, Config{Boundary: -1}).WriteChart(&b, "png"); err != nil {
		t.Fatal(err)
	}
	if img, err := png.Decode(&b); err != nil || img.Bounds().Dy() >= full {
		t.Errorf("without a boundary client the chart should have one panel: %v", err)
	}
	b.Reset()
	if err := r.WriteChart(&b, "SVG"); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.Contains(s, "<svg") || !strings.Contains(s, "token bucket") {
		t.Errorf("SVG chart lacks the svg element or the legend")
	}
	if err := r.WriteChart(&b, "gif"); err == nil {
		t.Errorf("gif accepted")
	}
}

func TestTrafficTitle(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  Config
		want string
	}{
		{Config{CronClients: 3, CronBatch: 10}, "3 cron clients firing 10 requests at every :00, plus the boundary client"},
		{Config{CronClients: 3, CronBatch: 10, Boundary: -1}, "3 cron clients firing 10 requests at every :00"},
		{Config{}, "the boundary client"},
		{Config{Boundary: -1}, "no traffic"},
	} {
		if got := (&Report{Config: tt.cfg}).trafficTitle(); got != tt.want {
			t.Errorf("%+v: got %q, want %q", tt.cfg, got, tt.want)
		}
	}
}

func ExampleRun() {
	r, err := Run(Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("boundary client, most admitted in any 20 s: fixed window %d, token bucket %d (bound %.0f)\n",
		r.Fixed.BoundaryMaxInSpan, r.Bucket.BoundaryMaxInSpan, r.Config.BucketBound(20*time.Second))
	fmt.Printf("peak admitted per second: fixed window %d, token bucket %d\n", r.Fixed.PeakPerSecond, r.Bucket.PeakPerSecond)
	// Output:
	// boundary client, most admitted in any 20 s: fixed window 1200, token bucket 219 (bound 220)
	// peak admitted per second: fixed window 1060, token bucket 210
}
