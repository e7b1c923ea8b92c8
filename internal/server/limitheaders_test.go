package server

import (
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/prototext"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/config"
	"github.com/fleetrate/fleetrate/memstore"
)

// limitHeadersConfig gives each rule a distinct requests_per_unit, so that
// RateLimit-Limit names the descriptor that was reported.
const limitHeadersConfig = `
domain: edge
descriptors:
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: five
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: one
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: two
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: free
    rate_limit: {unlimited: true}
  - key: never
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: big
    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}
`

// envoyFields returns the response's headers by name, failing unless
// each appears at most once.
func envoyFields(t *testing.T, r *rlspb.RateLimitResponse) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, h := range r.ResponseHeadersToAdd {
		if _, dup := got[h.Key]; dup {
			t.Fatalf("header %s twice: %v", h.Key, r.ResponseHeadersToAdd)
		}
		got[h.Key] = h.Value
	}
	return got
}

// wantLimitHeaders checks the three headers under their default names.
func wantLimitHeaders(t *testing.T, r *rlspb.RateLimitResponse, limit, remaining, reset string) {
	t.Helper()
	got := envoyFields(t, r)
	if got[DefaultLimitHeader] != limit || got[DefaultRemainingHeader] != remaining || got[DefaultResetHeader] != reset {
		t.Errorf("headers %v, want %s=%s %s=%s %s=%s", got, DefaultLimitHeader, limit, DefaultRemainingHeader, remaining, DefaultResetHeader, reset)
	}
}

// TestLimitHeaders walks envoyproxy/ratelimit's cases of its response
// headers (src/service/ratelimit.go and its tests): which descriptor is
// reported, and its numbers, on grants and denials.
func TestLimitHeaders(t *testing.T) {
	t.Parallel()
	on := func(o *Options) { o.LimitHeaders.Enabled = true }
	t.Run("one grant", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on)
		r := ts.should(t, "edge", 1, desc("ten", "x"))
		// 10/minute after one hit: 9 left, full again in 6 s, as the
		// status says.
		if d := r.Statuses[0].DurationUntilReset.GetSeconds(); d != 6 {
			t.Fatalf("duration_until_reset %d s, want 6", d)
		}
		wantLimitHeaders(t, r, "10", "9", "6")
		if len(r.ResponseHeadersToAdd) != 3 {
			t.Errorf("headers %v, want only envoyproxy/ratelimit's three", r.ResponseHeadersToAdd)
		}
	})
	t.Run("denial says 0 left and when it would pass", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on)
		ts.should(t, "edge", 1, desc("one", "x"))
		r := ts.should(t, "edge", 1, desc("one", "x"), desc("unmatched", "y"))
		if r.OverallCode != over {
			t.Fatalf("code %v, want OVER_LIMIT", r.OverallCode)
		}
		wantLimitHeaders(t, r, "1", "0", "60")
	})
	t.Run("fewest left wins, the first of equals", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on)
		wantLimitHeaders(t, ts.should(t, "edge", 1, desc("ten", "x"), desc("five", "x"), desc("two", "x")), "2", "1", "30")
		// ten has 8 left, five 3, two 0 (its last token): two.
		wantLimitHeaders(t, ts.should(t, "edge", 1, desc("ten", "x"), desc("two", "x"), desc("five", "x")), "2", "0", "60")
	})
	t.Run("the last descriptor over its limit wins", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on)
		ts.should(t, "edge", 1, desc("one", "x"))
		ts.should(t, "edge", 2, desc("two", "x"))
		r := ts.should(t, "edge", 1, desc("one", "x"), desc("ten", "x"), desc("two", "x"))
		wantLimitHeaders(t, r, "2", "0", "30")
		r = ts.should(t, "edge", 1, desc("two", "x"), desc("ten", "x"), desc("one", "x"))
		wantLimitHeaders(t, r, "1", "0", "60")
	})
	t.Run("quota and shadow descriptors over their limit are not forced", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on)
		ts.should(t, "edge", 1, desc("one", "x"))
		ts.should(t, "edge", 3, desc("quota", "x"))
		ts.should(t, "edge", 4, desc("shadow", "x"))
		// one is over first; quota and shadow (0 left too) do not replace
		// it, as a later ordinary denial would.
		wantLimitHeaders(t, ts.should(t, "edge", 1, desc("one", "x"), desc("quota", "x"), desc("shadow", "x")), "1", "0", "60")
		// Without an ordinary denial, the first with 0 left is reported.
		wantLimitHeaders(t, ts.should(t, "edge", 1, desc("ten", "x"), desc("shadow", "x"), desc("quota", "x")), "4", "0", "15")
	})
	t.Run("unlimited and unmatched report nothing", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on)
		if r := ts.should(t, "edge", 1, desc("free", "x"), desc("unmatched", "x")); len(r.ResponseHeadersToAdd) != 0 {
			t.Errorf("headers %v, want none", r.ResponseHeadersToAdd)
		}
		wantLimitHeaders(t, ts.should(t, "edge", 1, desc("free", "x"), desc("five", "x")), "5", "4", "12")
	})
	t.Run("a limit of 0 and a cost above the burst", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on)
		wantLimitHeaders(t, ts.should(t, "edge", 1, desc("never", "x")), "0", "0", "3600")
		// No wait admits 3 tokens of a burst of 2: the limit's period.
		wantLimitHeaders(t, ts.should(t, "edge", 3, desc("big", "x")), "1", "0", "1")
	})
	t.Run("global shadow and quota modes", func(t *testing.T) {
		t.Parallel()
		ts := start(t, limitHeadersConfig, on, func(o *Options) { o.ShadowMode = true })
		ts.should(t, "edge", 1, desc("one", "x"))
		r := ts.should(t, "edge", 1, desc("one", "x"))
		if r.OverallCode != ok {
			t.Fatalf("code %v, want OK in global shadow mode", r.OverallCode)
		}
		wantLimitHeaders(t, r, "1", "0", "60")
		ts = start(t, limitHeadersConfig, on, func(o *Options) { o.QuotaMode = true })
		ts.should(t, "edge", 1, desc("one", "x"))
		ts.should(t, "edge", 1, desc("two", "x"))
		// In quota mode nothing is forced: the first with 0 left.
		wantLimitHeaders(t, ts.should(t, "edge", 1, desc("one", "x"), desc("two", "x")), "1", "0", "60")
	})
}

// TestLimitHeadersNamesAndBothKinds: the names are configurable, as
// LIMIT_*_HEADER make them, and the IETF draft's fields can be on too.
func TestLimitHeadersNamesAndBothKinds(t *testing.T) {
	t.Parallel()
	ts := start(t, limitHeadersConfig, func(o *Options) {
		o.ResponseHeaders = true
		o.LimitHeaders = LimitHeaders{Enabled: true, Limit: "A-Ratelimit-Limit", Remaining: "A-Ratelimit-Remaining", Reset: "A-Ratelimit-Reset"}
	})
	got := envoyFields(t, ts.should(t, "edge", 1, desc("ten", "x")))
	if len(got) != 5 || got["A-Ratelimit-Limit"] != "10" || got["A-Ratelimit-Remaining"] != "9" || got["A-Ratelimit-Reset"] != "6" ||
		got[HeaderRateLimit] == "" || got[HeaderRateLimitPolicy] == "" {
		t.Errorf("headers %v, want the draft's two and the three renamed", got)
	}
	// Over HTTP (/json) too.
	var out struct {
		ResponseHeadersToAdd []struct{ Key, Value string } `json:"responseHeadersToAdd"`
	}
	if code := ts.post(t, "/json", map[string]any{"domain": "edge", "descriptors": []any{map[string]any{"entries": []any{map[string]string{"key": "ten", "value": "x"}}}}}, &out); code != 200 {
		t.Fatalf("/json: %d", code)
	}
	names := ""
	for _, h := range out.ResponseHeadersToAdd {
		names += h.Key + "=" + h.Value + " "
	}
	if !strings.Contains(names, "A-Ratelimit-Remaining=8 ") {
		t.Errorf("/json headers %q, want A-Ratelimit-Remaining=8", names)
	}
}

// TestLimitHeadersBadName: a name that is no HTTP field name is refused,
// naming it.
func TestLimitHeadersBadName(t *testing.T) {
	t.Parallel()
	o := Options{Store: failingStore{}, Config: start(t, "domain: d\n").Config(), LimitHeaders: LimitHeaders{Enabled: true, Reset: "Rate Limit: Reset"}}
	_, err := New(o)
	if !errors.Is(err, fleetrate.ErrInvalid) || !strings.Contains(err.Error(), `"Rate Limit: Reset"`) || !strings.Contains(err.Error(), "reset") {
		t.Errorf("New: %v, want ErrInvalid naming the reset header's name", err)
	}
}

// TestOverrideText: dynamic metadata's "limit" is what
// envoyproxy/ratelimit writes, the override's String(): protobuf's text
// format, whose spacing protobuf-go varies per binary.
func TestOverrideText(t *testing.T) {
	t.Parallel()
	for _, l := range []*rlcommon.RateLimitDescriptor_RateLimitOverride{
		{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_MINUTE},
		{RequestsPerUnit: 7},
		{Unit: typev3.RateLimitUnit_YEAR},
		{RequestsPerUnit: 1, Unit: 42},
		{},
	} {
		want := strings.Join(strings.Fields(prototext.MarshalOptions{}.Format(l)), " ")
		if got := overrideText(l); got != want {
			t.Errorf("overrideText(%v) = %q, want %q", l, got, want)
		}
	}
	if got := overrideText(&rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_MINUTE}); got != "requests_per_unit:100 unit:MINUTE" {
		t.Errorf("got %q", got)
	}
	ts := start(t, limitHeadersConfig, func(o *Options) { o.ResponseDynamicMetadata = true })
	d := desc("ten", "x")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 100, Unit: typev3.RateLimitUnit_MINUTE}
	m := ts.should(t, "edge", 1, d).DynamicMetadata.AsMap()
	if got := m["descriptors"].([]any)[0].(map[string]any)["limit"]; got != "requests_per_unit:100 unit:MINUTE" {
		t.Errorf("metadata limit %v, want envoyproxy/ratelimit's text", got)
	}
}

// BenchmarkRLSHeaders is BenchmarkRLS with envoyproxy/ratelimit's headers,
// the IETF draft's fields, both, or neither: what each costs a decision.
//
//	go test -run '^$' -bench BenchmarkRLSHeaders -benchmem ./internal/server
func BenchmarkRLSHeaders(b *testing.B) {
	cfg, err := config.Load("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name       string
		ietf, ours bool
	}{{"none", false, false}, {"limit", false, true}, {"ietf", true, false}, {"both", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := New(Options{Store: memstore.New(memstore.Options{}), Config: cfg, StoreBounded: true,
				ResponseHeaders: bc.ietf, LimitHeaders: LimitHeaders{Enabled: bc.ours},
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			reqs := make([]*rlspb.RateLimitRequest, 10_000)
			for i := range reqs {
				reqs[i] = &rlspb.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "bench:"+strconv.Itoa(i))}}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				resp, err := s.shouldRateLimit(b.Context(), reqs[i%len(reqs)])
				if err != nil || resp.OverallCode != ok {
					b.Fatalf("%v, %v", resp, err)
				}
				i++
			}
		})
	}
}
