package headers

import (
	"errors"
	"net/http"
	"reflect"
	"strconv"
	"testing"
	"time"
)

func TestFormatPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   []Policy
		want string
	}{
		{"draft example", []Policy{{Name: "default", Quota: 100, Window: 10 * time.Second}}, `"default";q=100;w=10`},
		{"two policies", []Policy{
			{Name: "permin", Quota: 50, Window: time.Minute},
			{Name: "perhr", Quota: 1000, Window: time.Hour},
		}, `"permin";q=50;w=60, "perhr";q=1000;w=3600`},
		{"window rounds up", []Policy{{Name: "a", Quota: 3, Window: 1500 * time.Millisecond}}, `"a";q=3;w=2`},
		{"no window", []Policy{{Name: "a", Quota: 0}}, `"a";q=0`},
		{"unit and partition key", []Policy{{Name: "peruser", Quota: 65535, Unit: UnitContentBytes, Window: 10 * time.Second, PartitionKey: []byte("App-999")}},
			`"peruser";q=65535;qu="content-bytes";w=10;pk=:QXBwLTk5OQ==:`},
		{"quotes escaped", []Policy{{Name: `a"b\c`, Quota: 1}}, `"a\"b\\c";q=1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := FormatPolicy(tt.in...)
			if err != nil {
				t.Fatalf("FormatPolicy: %v", err)
			}
			if got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			back, err := ParsePolicy(got)
			if err != nil {
				t.Fatalf("ParsePolicy(%s): %v", got, err)
			}
			if len(back) != len(tt.in) {
				t.Fatalf("parsed %d policies, want %d", len(back), len(tt.in))
			}
			for i := range back {
				if back[i].Name != tt.in[i].Name || back[i].Quota != tt.in[i].Quota {
					t.Errorf("policy %d parsed as %+v, want %+v", i, back[i], tt.in[i])
				}
			}
		})
	}
}

func TestFormatPolicyInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   []Policy
	}{
		{"none", nil},
		{"negative quota", []Policy{{Name: "a", Quota: -1}}},
		{"huge quota", []Policy{{Name: "a", Quota: MaxInteger + 1}}},
		{"newline in name", []Policy{{Name: "a\nb", Quota: 1}}},
		{"non-ASCII name", []Policy{{Name: "ä", Quota: 1}}},
		{"negative window", []Policy{{Name: "a", Quota: 1, Window: -time.Second}}},
		{"duplicate", []Policy{{Name: "a", Quota: 1}, {Name: "a", Quota: 2}}},
		{"bad unit", []Policy{{Name: "a", Quota: 1, Unit: "\x00"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got, err := FormatPolicy(tt.in...); !errors.Is(err, ErrInvalid) {
				t.Errorf("FormatPolicy = %q, %v; want an error wrapping ErrInvalid", got, err)
			}
		})
	}
}

func TestFormatRateLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   []Limit
		want string
	}{
		{"draft example", []Limit{{Name: "default", Remaining: 50, Reset: 30 * time.Second, HasReset: true}}, `"default";r=50;t=30`},
		{"reset rounds up", []Limit{{Name: "a", Remaining: 0, Reset: time.Nanosecond, HasReset: true}}, `"a";r=0;t=1`},
		{"reset zero", []Limit{{Name: "a", Remaining: 20, HasReset: true}}, `"a";r=20;t=0`},
		{"no reset", []Limit{{Name: "default", Remaining: 999, PartitionKey: []byte("trial121323")}}, `"default";r=999;pk=:dHJpYWwxMjEzMjM=:`},
		{"two", []Limit{{Name: "a", Remaining: 1}, {Name: "b", Remaining: 2}}, `"a";r=1, "b";r=2`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := FormatRateLimit(tt.in...)
			if err != nil {
				t.Fatalf("FormatRateLimit: %v", err)
			}
			if got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
			if _, err := ParseRateLimit(got); err != nil {
				t.Errorf("ParseRateLimit(%s): %v", got, err)
			}
		})
	}
}

func TestFormatRateLimitInvalid(t *testing.T) {
	t.Parallel()
	for name, in := range map[string][]Limit{
		"none":             nil,
		"negative":         {{Name: "a", Remaining: -1}},
		"huge":             {{Name: "a", Remaining: MaxInteger + 1}},
		"control in name":  {{Name: "a\x7f", Remaining: 1}},
		"negative reset":   {{Name: "a", Remaining: 1, Reset: -1, HasReset: true}},
		"unicode in name":  {{Name: "日本", Remaining: 1}},
		"carriage returns": {{Name: "a\r\nSet-Cookie: x", Remaining: 1}},
	} {
		if got, err := FormatRateLimit(in...); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: FormatRateLimit = %q, %v; want an error wrapping ErrInvalid", name, got, err)
		}
	}
}

// TestParseDraftExamples parses every example field of the draft
// (revision 11) with the draft's rules.
func TestParseDraftExamples(t *testing.T) {
	t.Parallel()
	policies := []string{
		`"burst";q=100;w=60,"daily";q=1000;w=86400`,
		`"default";q=100;w=10`,
		`"permin";q=50;w=60,"perhr";q=1000;w=3600`,
		`"peruser";q=100;w=60;pk=:cHsdsRa894==:`,
		`"peruser";q=65535;qu="content-bytes";w=10;pk=:sdfjLJUOUH==:`,
		`"basic";q=100;w=60`,
		`"somepolicy";q=10000;w=1000`,
	}
	for _, p := range policies {
		if _, err := ParsePolicy(p); err != nil {
			t.Errorf("ParsePolicy(%s): %v", p, err)
		}
	}
	limits := []string{
		`"default";r=50;t=30`,
		`"default";r=999;pk=:dHJpYWwxMjEzMjM=:`,
		`"default";r=300000000;t=60;pk=:QXBwLTk5OQ==:`,
		`"problemPolicy";r=0;t=10`,
		`"dayLimit";r=100;t=36000`,
		`"daily";r=1;t=86400`,
	}
	for _, l := range limits {
		if _, err := ParseRateLimit(l); err != nil {
			t.Errorf("ParseRateLimit(%s): %v", l, err)
		}
	}
}

func TestParseRejectsDraftViolations(t *testing.T) {
	t.Parallel()
	for _, p := range []string{
		``,
		`default;q=100`,          // token, not string
		`"a";w=10`,               // q missing
		`"a";q=-1`,               // negative quota
		`"a";q=1.5`,              // decimal quota
		`"a";q=1;w=0`,            // zero window
		`"a";q=1;qu=requests`,    // unit as token
		`"a";q=1;pk="x"`,         // pk as string
		`("a");q=1`,              // inner list
		`"a";q=100;w=60,`,        // grammar
		`RateLimit-Policy: "a"q`, // grammar
	} {
		if got, err := ParsePolicy(p); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParsePolicy(%q) = %+v, %v; want ErrInvalid", p, got, err)
		}
	}
	for _, l := range []string{
		``,
		`"a";t=1`,         // r missing
		`"a";r=-1`,        // negative
		`"a";r=1;t=-1`,    // negative reset
		`"a";r=1;t=?1`,    // boolean reset
		`"a";r=1;pk=1`,    // pk integer
		`limit=100, r=50`, // pre-08 syntax
		`1;r=1`,           // integer item
	} {
		if got, err := ParseRateLimit(l); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRateLimit(%q) = %+v, %v; want ErrInvalid", l, got, err)
		}
	}
}

func TestParseIgnoresUnknownParams(t *testing.T) {
	t.Parallel()
	got, err := ParseRateLimit(`"a";r=5;t=2;acme-burst=10;flag`)
	if err != nil {
		t.Fatal(err)
	}
	want := []Limit{{Name: "a", Remaining: 5, Reset: 2 * time.Second, HasReset: true}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestDelaySeconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0},
		{0, 0},
		{time.Nanosecond, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Nanosecond, 2},
		{100 * time.Millisecond, 1},
		{59*time.Second + 1, 60},
		{time.Hour, 3600},
	}
	for _, tt := range tests {
		if got := DelaySeconds(tt.d); got != tt.want {
			t.Errorf("DelaySeconds(%v) = %d, want %d", tt.d, got, tt.want)
		}
		if got, want := FormatRetryAfter(tt.d), strconv.FormatInt(tt.want, 10); got != want {
			t.Errorf("FormatRetryAfter(%v) = %s, want %s", tt.d, got, want)
		}
	}
}

func TestSetLegacy(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	SetLegacy(h, Legacy{Limit: 20, Remaining: 3, Reset: time.Unix(1700000000, 1)})
	for k, want := range map[string]string{XRateLimitLimit: "20", XRateLimitRemaining: "3", XRateLimitReset: "1700000001"} {
		if got := h.Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if len(h) != 3 {
		t.Errorf("got %d fields, want 3: %v", len(h), h)
	}
}
