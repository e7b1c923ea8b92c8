package ratelimitheader

import (
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"
)

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

type tcase struct {
	name     string
	h        map[string][]string
	forms    Form
	form     Form
	req, tok Quota
	ignored  []Reason
}

func run(t *testing.T, cases []tcase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			for k, vs := range c.h {
				for _, v := range vs {
					h.Add(k, v)
				}
			}
			forms := c.forms
			if forms == 0 {
				forms = All
			}
			got := Parse(h, now, forms)
			if got.Form != c.form || got.Requests != c.req || got.Tokens != c.tok {
				t.Errorf("Parse(%v) = form %v requests %+v tokens %+v; want form %v requests %+v tokens %+v",
					c.h, got.Form, got.Requests, got.Tokens, c.form, c.req, c.tok)
			}
			var why []Reason
			for _, ig := range got.Ignored {
				why = append(why, ig.Reason)
			}
			if !slices.Equal(why, c.ignored) {
				t.Errorf("Parse(%v) ignored %+v; want reasons %v", c.h, got.Ignored, c.ignored)
			}
		})
	}
}

func TestXRateLimit(t *testing.T) {
	t.Parallel()
	x := func(l, r, s string) map[string][]string {
		h := map[string][]string{}
		for k, v := range map[string]string{"X-RateLimit-Limit": l, "X-RateLimit-Remaining": r, "X-RateLimit-Reset": s} {
			if v != "" {
				h[k] = []string{v}
			}
		}
		return h
	}
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	run(t, []tcase{
		{name: "delay seconds", h: x("60", "12", "30"), form: XRateLimit, req: Quota{Limit: 60, Remaining: 12, Reset: 30 * time.Second}},
		{name: "unix seconds", h: x("5000", "4999", epoch(40*time.Minute)), form: XRateLimit, req: Quota{Limit: 5000, Remaining: 4999, Reset: 40 * time.Minute}},
		{name: "fractional delay", h: x("10", "0", "1.5"), form: XRateLimit, req: Quota{Limit: 10, Remaining: 0, Reset: 1500 * time.Millisecond}},
		{name: "limit only", h: x("10", "", ""), form: XRateLimit, req: Quota{Limit: 10}},
		{name: "remaining above limit", h: x("10", "11", "3"), form: XRateLimit, ignored: []Reason{AboveLimit}},
		{name: "negative remaining", h: x("10", "-1", "3"), form: XRateLimit, req: Quota{Limit: 10}, ignored: []Reason{Negative, Missing}},
		{name: "zero limit", h: x("0", "0", "3"), form: XRateLimit, req: Quota{Remaining: 0, Reset: 3 * time.Second}, ignored: []Reason{Negative}},
		{name: "garbage reset", h: x("10", "5", "soon"), form: XRateLimit, req: Quota{Limit: 10}, ignored: []Reason{Garbage, Missing}},
		{name: "reset in the past", h: x("10", "5", epoch(-time.Hour)), form: XRateLimit, req: Quota{Limit: 10}, ignored: []Reason{Past, Missing}},
		{name: "reset too far", h: x("10", "5", "999999"), form: XRateLimit, req: Quota{Limit: 10}, ignored: []Reason{TooFar, Missing}},
		{name: "unix reset too far", h: x("10", "5", epoch(48*time.Hour)), form: XRateLimit, req: Quota{Limit: 10}, ignored: []Reason{TooFar, Missing}},
		{name: "lines disagree", h: map[string][]string{"X-RateLimit-Limit": {"10", "20"}}, form: XRateLimit, ignored: []Reason{Conflict}},
		{name: "lines agree", h: map[string][]string{"X-RateLimit-Limit": {"10", "10"}}, form: XRateLimit, req: Quota{Limit: 10}},
		{name: "huge number", h: x("99999999999999999999", "", ""), form: XRateLimit, ignored: []Reason{Garbage}},
		{name: "none", h: map[string][]string{"Content-Type": {"text/plain"}}},
		{name: "form not asked for", h: x("60", "12", "30"), forms: Draft | OpenAI},
	})
}

func TestDraft(t *testing.T) {
	t.Parallel()
	run(t, []tcase{
		{name: "current", h: map[string][]string{"RateLimit-Policy": {`"hidden";q=12;w=1`}, "RateLimit": {`"hidden";r=5;t=1`}},
			form: Draft, req: Quota{Limit: 12, Window: time.Second, Remaining: 5, Reset: time.Second}},
		{name: "tokens as names", h: map[string][]string{"RateLimit-Policy": {`default;q=100;w=60`}, "RateLimit": {`default;r=50;t=30`}},
			form: Draft, req: Quota{Limit: 100, Window: time.Minute, Remaining: 50, Reset: 30 * time.Second}},
		{name: "fewest remaining decides", h: map[string][]string{
			"RateLimit-Policy": {`"burst";q=100;w=60, "daily";q=1000;w=86400`}, "RateLimit": {`"burst";r=80;t=20, "daily";r=7;t=3600`}},
			form: Draft, req: Quota{Limit: 1000, Window: 24 * time.Hour, Remaining: 7, Reset: time.Hour}},
		{name: "policy alone: lowest rate", h: map[string][]string{"RateLimit-Policy": {`"a";q=100;w=10, "b";q=600;w=60`, `"c";q=5;w=1`}},
			form: Draft, req: Quota{Limit: 5, Window: time.Second}},
		{name: "other unit left out", h: map[string][]string{"RateLimit-Policy": {`"bytes";q=10;qu="content-bytes";w=1, "req";q=50;w=1`}},
			form: Draft, req: Quota{Limit: 50, Window: time.Second}},
		{name: "remaining above policy", h: map[string][]string{"RateLimit-Policy": {`"p";q=10;w=1`}, "RateLimit": {`"p";r=11;t=1`}},
			form: Draft, req: Quota{Limit: 10, Window: time.Second}, ignored: []Reason{AboveLimit}},
		{name: "no reset", h: map[string][]string{"RateLimit": {`"p";r=3`}}, form: Draft, ignored: []Reason{Missing}},
		{name: "garbage list", h: map[string][]string{"RateLimit": {`"p";r=3;t=`}}, form: Draft, ignored: []Reason{Garbage}},
		{name: "negative r", h: map[string][]string{"RateLimit": {`"p";r=-3;t=1`}}, form: Draft, ignored: []Reason{Negative}},
		{name: "t too far", h: map[string][]string{"RateLimit": {`"p";r=3;t=999999`}}, form: Draft, ignored: []Reason{TooFar}},
		{name: "dictionary", h: map[string][]string{"RateLimit": {"limit=100, remaining=50, reset=5"}},
			form: Draft, req: Quota{Limit: 100, Remaining: 50, Reset: 5 * time.Second}},
		{name: "dictionary above limit", h: map[string][]string{"RateLimit": {"limit=10, remaining=50, reset=5"}},
			form: Draft, ignored: []Reason{AboveLimit}},
		{name: "dictionary garbage", h: map[string][]string{"RateLimit": {"limit=10, remaining"}}, form: Draft, ignored: []Reason{Garbage}},
		{name: "fields of revision 06", h: map[string][]string{"RateLimit-Limit": {"10, 10;w=1, 50;w=60"}, "RateLimit-Remaining": {"9"}, "RateLimit-Reset": {"1"}},
			form: Draft, req: Quota{Limit: 10, Remaining: 9, Reset: time.Second}},
		{name: "fields with a window", h: map[string][]string{"RateLimit-Limit": {"100;w=60"}, "RateLimit-Remaining": {"9"}, "RateLimit-Reset": {"30"}},
			form: Draft, req: Quota{Limit: 100, Window: time.Minute, Remaining: 9, Reset: 30 * time.Second}},
		{name: "fields: a unix reset is not the draft's", h: map[string][]string{"RateLimit-Remaining": {"9"}, "RateLimit-Reset": {"1780000000"}},
			form: Draft, ignored: []Reason{TooFar, Missing}},
		{name: "policy of revision 06", h: map[string][]string{"RateLimit-Policy": {"100;w=60"}},
			form: Draft, req: Quota{Limit: 100, Window: time.Minute}},
		{name: "draft before x-ratelimit", h: map[string][]string{"RateLimit": {`"p";r=3;t=2`}, "X-RateLimit-Remaining": {"9"}},
			form: Draft, req: Quota{Remaining: 3, Reset: 2 * time.Second}},
	})
}

func TestOpenAI(t *testing.T) {
	t.Parallel()
	run(t, []tcase{
		{name: "both", h: map[string][]string{
			"x-ratelimit-limit-requests": {"60"}, "x-ratelimit-remaining-requests": {"59"}, "x-ratelimit-reset-requests": {"1s"},
			"x-ratelimit-limit-tokens": {"150000"}, "x-ratelimit-remaining-tokens": {"149984"}, "x-ratelimit-reset-tokens": {"6m0s"}},
			form: OpenAI, req: Quota{Limit: 60, Window: time.Minute, Remaining: 59, Reset: time.Second},
			tok: Quota{Limit: 150000, Window: time.Minute, Remaining: 149984, Reset: 6 * time.Minute}},
		{name: "milliseconds", h: map[string][]string{"x-ratelimit-remaining-requests": {"0"}, "x-ratelimit-reset-requests": {"20ms"}},
			form: OpenAI, req: Quota{Remaining: 0, Reset: 20 * time.Millisecond}},
		{name: "garbage duration", h: map[string][]string{"x-ratelimit-remaining-requests": {"0"}, "x-ratelimit-reset-requests": {"soon"}},
			form: OpenAI, ignored: []Reason{Garbage, Missing}},
		{name: "negative duration", h: map[string][]string{"x-ratelimit-remaining-requests": {"0"}, "x-ratelimit-reset-requests": {"-1s"}},
			form: OpenAI, ignored: []Reason{Negative, Missing}},
		{name: "too far", h: map[string][]string{"x-ratelimit-remaining-tokens": {"0"}, "x-ratelimit-reset-tokens": {"48h"}},
			form: OpenAI, ignored: []Reason{TooFar, Missing}},
	})
}

func TestAnthropic(t *testing.T) {
	t.Parallel()
	at := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339Nano) }
	run(t, []tcase{
		{name: "requests and tokens", h: map[string][]string{
			"anthropic-ratelimit-requests-limit": {"50"}, "anthropic-ratelimit-requests-remaining": {"49"}, "anthropic-ratelimit-requests-reset": {at(1200 * time.Millisecond)},
			"anthropic-ratelimit-tokens-limit": {"40000"}, "anthropic-ratelimit-tokens-remaining": {"39000"}, "anthropic-ratelimit-tokens-reset": {at(2 * time.Second)}},
			form: Anthropic, req: Quota{Limit: 50, Window: time.Minute, Remaining: 49, Reset: 1200 * time.Millisecond},
			tok: Quota{Limit: 40000, Window: time.Minute, Remaining: 39000, Reset: 2 * time.Second}},
		{name: "input and output: the tighter", h: map[string][]string{
			"anthropic-ratelimit-input-tokens-limit": {"40000"}, "anthropic-ratelimit-input-tokens-remaining": {"30000"}, "anthropic-ratelimit-input-tokens-reset": {at(time.Second)},
			"anthropic-ratelimit-output-tokens-limit": {"8000"}, "anthropic-ratelimit-output-tokens-remaining": {"100"}, "anthropic-ratelimit-output-tokens-reset": {at(3 * time.Second)}},
			form: Anthropic, tok: Quota{Limit: 8000, Window: time.Minute, Remaining: 100, Reset: 3 * time.Second}},
		{name: "not RFC 3339", h: map[string][]string{"anthropic-ratelimit-requests-remaining": {"1"}, "anthropic-ratelimit-requests-reset": {"Fri, 04 Dec 2026 12:00:01 GMT"}},
			form: Anthropic, ignored: []Reason{Garbage, Missing}},
		{name: "past", h: map[string][]string{"anthropic-ratelimit-requests-remaining": {"1"}, "anthropic-ratelimit-requests-reset": {at(-time.Minute)}},
			form: Anthropic, ignored: []Reason{Past, Missing}},
	})
}

// FuzzParse checks that no input makes Parse panic or give a value its
// rules exclude: counts negative, remaining above a limit, a reset beyond
// MaxReset or not positive with remaining stated.
func FuzzParse(f *testing.F) {
	for _, s := range [][2]string{
		{"X-RateLimit-Reset", "1780000000.5"}, {"RateLimit", `"p";r=3;t=2`}, {"RateLimit", "limit=10, remaining=3, reset=1"},
		{"RateLimit-Policy", `"p";q=10;w=1`}, {"x-ratelimit-reset-tokens", "6m0s"}, {"anthropic-ratelimit-requests-reset", "2026-12-04T12:00:01Z"},
		{"RateLimit-Limit", "10, 10;w=1"}, {"X-RateLimit-Remaining", "-0"},
	} {
		f.Add(s[0], s[1], "7", "3")
	}
	fields := []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit", "RateLimit-Policy",
		"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
		"x-ratelimit-reset-requests", "anthropic-ratelimit-tokens-limit", "anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"}
	f.Fuzz(func(t *testing.T, field, value, limit, remaining string) {
		h := http.Header{}
		h.Add(field, value)
		for _, k := range fields {
			switch {
			case len(k)%3 == 0:
				h.Add(k, limit)
			case len(k)%3 == 1:
				h.Add(k, remaining)
			default:
				h.Add(k, value)
			}
		}
		for _, forms := range []Form{All, Draft, XRateLimit, OpenAI, Anthropic} {
			r := Parse(h, now, forms)
			for _, q := range []Quota{r.Requests, r.Tokens} {
				if q.Limit < 0 || q.Remaining < 0 || q.Window < 0 || q.Reset < 0 || q.Reset > MaxReset ||
					q.Limit > 0 && q.Reset > 0 && q.Remaining > q.Limit || q.Reset == 0 && q.Remaining != 0 {
					t.Fatalf("Parse(%v, %v) = %+v: out of its rules", h, forms, q)
				}
			}
		}
	})
}

// TestCheck holds a quota read by the user's own function to the rules
// of the built-in forms.
func TestCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		in, out Quota
		ignored []Reason
	}{
		{"whole", Quota{Limit: 10, Window: time.Second, Remaining: 3, Reset: time.Second}, Quota{Limit: 10, Window: time.Second, Remaining: 3, Reset: time.Second}, nil},
		{"nothing", Quota{}, Quota{}, nil},
		{"negative limit", Quota{Limit: -1}, Quota{}, []Reason{Negative}},
		{"window over a day", Quota{Limit: 10, Window: 48 * time.Hour}, Quota{}, []Reason{Garbage}},
		{"negative remaining", Quota{Remaining: -1, Reset: time.Second}, Quota{}, []Reason{Negative}},
		{"remaining without a reset", Quota{Remaining: 4}, Quota{}, []Reason{Missing}},
		{"reset in the past", Quota{Remaining: 4, Reset: -time.Second}, Quota{}, []Reason{Past}},
		{"reset too far", Quota{Remaining: 4, Reset: 25 * time.Hour}, Quota{}, []Reason{TooFar}},
		{"above the limit", Quota{Limit: 3, Remaining: 4, Reset: time.Second}, Quota{}, []Reason{AboveLimit}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := Check(c.in)
			var why []Reason
			for _, ig := range r.Ignored {
				why = append(why, ig.Reason)
			}
			if r.Form != Custom || r.Requests != c.out || !slices.Equal(why, c.ignored) {
				t.Errorf("Check(%+v) = %+v, want %+v ignoring %v", c.in, r, c.out, c.ignored)
			}
		})
	}
}
