package fleetrate

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestLimitValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		l    Limit
		want string
	}{
		{"zero rate", Limit{Rate: 0, Burst: 1}, "rate must be positive and finite, got 0"},
		{"negative rate", Limit{Rate: -1, Burst: 1}, "got -1"},
		{"nan", Limit{Rate: math.NaN(), Burst: 1}, "got NaN"},
		{"inf", Limit{Rate: math.Inf(1), Burst: 1}, "got +Inf"},
		{"period zero", PerPeriod(10, 0), "PerPeriod gives NaN for a count or period that is not positive"},
		{"interval zero", Every(0, 1), "Every gives +Inf for an interval that is not positive"},
		{"too fast", Limit{Rate: 2e9, Burst: 1}, "rate must be at most"},
		{"burst 0", Limit{Rate: 1, Burst: 0}, "burst must be at least 1, got 0"},
		{"fill too long", Limit{Rate: 1.0 / 3600, Burst: 20000}, "time to fill"},
		{"fill a day beyond MaxFillTime", PerPeriod(732, 732*24*time.Hour), "time to fill"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.l.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want error containing %q", err, c.want)
			}
		})
	}
	for _, ok := range []Limit{PerSecond(1e6, 1), PerSecond(1e9, 1), Every(time.Hour, 24), PerPeriod(100, time.Minute),
		PerPeriod(365, 365*24*time.Hour), PerPeriod(1, 730*24*time.Hour), PerPeriod(1<<30, 730*24*time.Hour)} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%v: %v", ok, err)
		}
	}
}

func TestInterval(t *testing.T) {
	t.Parallel()
	cases := []struct {
		l    Limit
		want int64
	}{
		{PerSecond(1e6, 1), 1000},
		{PerSecond(3, 1), 333_333_334},
		{PerPeriod(100, time.Minute), 600_000_000},
		{Every(time.Hour, 1), int64(time.Hour)},
		{PerSecond(7e5, 1), 1429},
		{PerSecond(1e9, 1), 1},
	}
	for _, c := range cases {
		if got := c.l.Interval(); got != c.want {
			t.Errorf("%v interval = %d, want %d", c.l, got, c.want)
		}
	}
	// Whatever the rate, the interval never grants faster than it.
	for _, l := range []Limit{PerPeriod(7, 60*24*time.Hour), PerSecond(1.0/3, 1), PerSecond(999_999.7, 1), PerPeriod(13, time.Hour)} {
		if iv := l.Interval(); float64(time.Second)/float64(iv) > l.Rate {
			t.Errorf("%v: interval %d ns grants %v/s, faster than the rate", l, iv, float64(time.Second)/float64(iv))
		}
	}
}

func TestRequestValidate(t *testing.T) {
	t.Parallel()
	b := Bucket{Key: "k", Limits: []Limit{PerSecond(1, 2)}}
	if err := (Request{Buckets: []Bucket{b}, N: 3}).Validate(); !errors.Is(err, ErrBurstExceeded) {
		t.Fatalf("n > burst: %v", err)
	}
	if err := (Request{Buckets: []Bucket{b}, N: -1}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("n < 0: %v", err)
	}
	if err := (Request{Buckets: []Bucket{b, b}, N: 1}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("duplicate key: %v", err)
	}
	split := []Bucket{{Prefix: "a", Key: "bc", Limits: b.Limits}, {Prefix: "ab", Key: "c", Limits: b.Limits}}
	if err := (Request{Buckets: split, N: 1}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("the same store key split two ways: %v", err)
	}
	if err := (Request{Buckets: []Bucket{{Key: "", Limits: b.Limits}}}).Validate(); err == nil || !strings.Contains(err.Error(), "buckets[0].key") {
		t.Fatalf("empty key: %v", err)
	}
	for _, c := range []struct {
		reserve, n int64
		want       error
		field      string
	}{
		{reserve: -1, n: 1, want: ErrInvalid, field: "reserve"},
		{reserve: 2, n: 0, want: ErrInvalid, field: "reserve"}, // the whole burst
		{reserve: 1, n: 2, want: ErrBurstExceeded, field: "reserve 1"},
		{reserve: 1, n: 1},
		{reserve: 1, n: 0},
	} {
		rb := b
		rb.Reserve = c.reserve
		err := (Request{Buckets: []Bucket{rb}, N: c.n}).Validate()
		if c.want == nil && err != nil || c.want != nil && (!errors.Is(err, c.want) || !strings.Contains(err.Error(), c.field)) {
			t.Errorf("reserve %d, n %d: got %v, want %v naming %q", c.reserve, c.n, err, c.want, c.field)
		}
	}
}

// TestCompiledLimitFollowsChanges checks that a Limiter's cached interval
// never outlives a change of the limit's Rate or Burst.
func TestCompiledLimitFollowsChanges(t *testing.T) {
	t.Parallel()
	l := PerSecond(10, 5).compiled()
	if l.Interval() != 100_000_000 || l.Validate() != nil {
		t.Fatalf("compiled %v: interval %d, %v", l, l.Interval(), l.Validate())
	}
	l.Rate = 1000
	if got := l.Interval(); got != 1_000_000 {
		t.Fatalf("after changing the rate the interval is %d, want 1000000", got)
	}
	l.Rate = 0
	if l.Validate() == nil {
		t.Fatal("a compiled limit changed to rate 0 still validates")
	}
	l = PerSecond(10, 5).compiled()
	l.Burst = 0
	if l.Validate() == nil {
		t.Fatal("a compiled limit changed to burst 0 still validates")
	}
	if p := PerSecond(10, 5).compiled().plain(); p != PerSecond(10, 5) {
		t.Fatalf("plain() = %+v, want the limit as callers built it", p)
	}
}

func TestLimitString(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		want string
	}{
		{PerSecond(20, 40), "20/s burst 40"},
		{PerSecond(100.0/60, 3), "1.66667/s burst 3"},
		{PerSecond(0.5, 1).Named("slow"), "slow 0.5/s burst 1"},
	} {
		if got := tc.l.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}
