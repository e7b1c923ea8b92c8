package server

import (
	"fmt"
	"math"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetrate/fleetrate/internal/headers"
)

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
)

// rlsConfig is an envoyproxy/ratelimit configuration plus fleetrate's
// extensions.
const rlsConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: api_key
    rate_limits:
      - {name: burst, unit: second, requests_per_unit: 2, burst: 4}
      - {name: daily, unit: day, requests_per_unit: 5}
  - key: ldap
    rate_limit: {unlimited: true}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tier
    value: free
    rate_limit: {name: free, unit: minute, requests_per_unit: 1}
  - key: user
    value: vip
    rate_limit: {replaces: [{name: free}], unit: minute, requests_per_unit: 100}
`

func codes_(resp *rlspb.RateLimitResponse) []rlspb.RateLimitResponse_Code {
	var cs []rlspb.RateLimitResponse_Code
	for _, s := range resp.Statuses {
		cs = append(cs, s.Code)
	}
	return cs
}

func TestGRPCAllowedThenOverLimit(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	for i, want := range []uint32{2, 1, 0} {
		resp := ts.should(t, "edge", 0, desc("remote_address", "10.0.0.1"))
		if resp.OverallCode != ok {
			t.Fatalf("request %d: %v, want OK", i, resp.OverallCode)
		}
		st := resp.Statuses[0]
		if st.LimitRemaining != want || st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit() != rlspb.RateLimitResponse_RateLimit_SECOND {
			t.Errorf("request %d: status %v, want remaining %d of 3/second", i, st, want)
		}
	}
	resp := ts.should(t, "edge", 0, desc("remote_address", "10.0.0.1"))
	if resp.OverallCode != over || resp.Statuses[0].Code != over {
		t.Fatalf("4th request: %v, want OVER_LIMIT", resp)
	}
	// A token bucket refills one token every 1/3 s, not a whole window; Envoy
	// reads whole seconds, so the wait is rounded up to 1 s.
	if got, want := resp.Statuses[0].DurationUntilReset.AsDuration(), time.Second; got != want {
		t.Errorf("duration_until_reset = %v, want %v", got, want)
	}
	// Another address has its own bucket.
	if r := ts.should(t, "edge", 0, desc("remote_address", "10.0.0.2")); r.OverallCode != ok {
		t.Errorf("other address: %v, want OK", r.OverallCode)
	}
	ts.clock.Advance(334 * time.Millisecond)
	if r := ts.should(t, "edge", 0, desc("remote_address", "10.0.0.1")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("after one refill interval: %v, want OK with 0 left", r)
	}
}

func TestGRPCRequestHitsAddendZeroCountsAsOne(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	if r := ts.should(t, "edge", 0, desc("remote_address", "a")); r.Statuses[0].LimitRemaining != 2 {
		t.Errorf("hits_addend 0: remaining %d, want 2 (counted as one hit)", r.Statuses[0].LimitRemaining)
	}
	if r := ts.should(t, "edge", 2, desc("remote_address", "a")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("hits_addend 2: %v, want OK with 0 left", r)
	}
	if r := ts.should(t, "edge", 0, desc("remote_address", "a")); r.OverallCode != over {
		t.Errorf("hits_addend 0 on an empty bucket: %v, want OVER_LIMIT", r.OverallCode)
	}
}

func TestGRPCDescriptorHitsAddendZeroPeeks(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	peek := desc("remote_address", "p")
	peek.HitsAddend = wrapperspb.UInt64(0)
	for i := 0; i < 3; i++ {
		r := ts.should(t, "edge", 5, peek) // the descriptor's 0 overrides the request's 5
		if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 3 {
			t.Fatalf("peek %d: %v, want OK with 3 left", i, r)
		}
	}
	take := desc("remote_address", "p")
	take.HitsAddend = wrapperspb.UInt64(3)
	if r := ts.should(t, "edge", 1, take); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("descriptor hits_addend 3: %v, want OK with 0 left", r)
	}
	r := ts.should(t, "edge", 0, peek)
	if r.OverallCode != over || r.Statuses[0].LimitRemaining != 0 {
		t.Errorf("peek at an empty bucket: %v, want OVER_LIMIT", r)
	}
	ts.clock.Advance(334 * time.Millisecond)
	if r := ts.should(t, "edge", 0, peek); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 {
		t.Errorf("peek after a refill: %v, want OK with 1 left", r)
	}
}

func TestGRPCSeveralDescriptors(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	// 50.0.0.5 is denied outright; the other descriptor is fine alone.
	r := ts.should(t, "edge", 0, desc("remote_address", "10.1.1.1"), desc("remote_address", "50.0.0.5"), desc("nope", "x"))
	if r.OverallCode != over {
		t.Fatalf("overall %v, want OVER_LIMIT when any descriptor is over", r.OverallCode)
	}
	if got := codes_(r); got[0] != ok || got[1] != over || got[2] != ok {
		t.Errorf("statuses %v, want [OK OVER_LIMIT OK]", got)
	}
	if len(r.Statuses) != 3 {
		t.Fatalf("%d statuses, want 3", len(r.Statuses))
	}
	// The denied request spent nothing from the allowed descriptor.
	if got := r.Statuses[0].LimitRemaining; got != 3 {
		t.Errorf("remaining reported %d, want 3 (tokens given back)", got)
	}
	if r := ts.should(t, "edge", 0, desc("remote_address", "10.1.1.1")); r.Statuses[0].LimitRemaining != 2 {
		t.Errorf("after a denied multi-descriptor request, remaining %d, want 2", r.Statuses[0].LimitRemaining)
	}
	r = ts.should(t, "edge", 0, desc("remote_address", "10.1.1.2"), desc("ldap", "u"))
	if r.OverallCode != ok || codes_(r)[0] != ok || codes_(r)[1] != ok {
		t.Errorf("all under limit: %v", r)
	}
}

func TestGRPCUnknownDescriptorsAllowed(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	for _, tc := range []struct {
		name   string
		domain string
		d      *rlcommon.RateLimitDescriptor
	}{
		{"unknown domain", "nope", desc("remote_address", "1")},
		{"unknown key", "edge", desc("header", "x")},
		{"too many entries", "edge", desc("remote_address", "1", "path", "/")},
	} {
		for i := 0; i < 10; i++ {
			r := ts.should(t, tc.domain, 0, tc.d)
			if r.OverallCode != ok || r.Statuses[0].Code != ok || r.Statuses[0].CurrentLimit != nil {
				t.Fatalf("%s: %v, want OK without a limit", tc.name, r)
			}
		}
	}
}

func TestGRPCRuleKinds(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	t.Run("unlimited", func(t *testing.T) {
		r := ts.should(t, "edge", 1000, desc("ldap", "u"))
		if r.OverallCode != ok || r.Statuses[0].LimitRemaining != math.MaxUint32 {
			t.Errorf("%v, want OK with MaxUint32 left", r)
		}
	})
	t.Run("requests_per_unit 0 denies", func(t *testing.T) {
		r := ts.should(t, "edge", 0, desc("remote_address", "50.0.0.5"))
		if r.OverallCode != over || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 0 {
			t.Errorf("%v, want OVER_LIMIT with a 0 limit", r)
		}
	})
	t.Run("shadow mode", func(t *testing.T) {
		for i := 0; i < 3; i++ {
			if r := ts.should(t, "edge", 0, desc("shadowed", "s")); r.OverallCode != ok || r.Statuses[0].Code != ok {
				t.Fatalf("request %d: %v, want OK", i, r)
			}
		}
		if !metricHas(t, ts, `fleetrate_decisions_total{api="rls",descriptor="edge.shadowed",domain="edge",result="shadow_over_limit"} 2`) {
			t.Error("shadow_over_limit not counted")
		}
	})
	t.Run("several limits", func(t *testing.T) {
		for i := 0; i < 4; i++ {
			if r := ts.should(t, "edge", 0, desc("api_key", "k")); r.OverallCode != ok {
				t.Fatalf("request %d: %v", i, r)
			}
		}
		r := ts.should(t, "edge", 0, desc("api_key", "k"))
		if r.OverallCode != over || r.Statuses[0].CurrentLimit.GetName() != "burst" || r.Statuses[0].DurationUntilReset.AsDuration() != time.Second {
			t.Errorf("5th: %v, want OVER_LIMIT by the burst limit for 500ms (daily has 1 left)", r)
		}
		ts.clock.Advance(time.Second)
		r = ts.should(t, "edge", 0, desc("api_key", "k"))
		if r.OverallCode != ok || r.Statuses[0].CurrentLimit.GetName() != "daily" || r.Statuses[0].LimitRemaining != 0 {
			t.Errorf("after 1s: %v, want OK with the daily limit empty", r)
		}
		ts.clock.Advance(time.Second)
		if r := ts.should(t, "edge", 0, desc("api_key", "k")); r.OverallCode != over || r.Statuses[0].CurrentLimit.GetName() != "daily" {
			t.Errorf("daily limit spent: %v, want OVER_LIMIT by daily", r)
		}
	})
	t.Run("replaces", func(t *testing.T) {
		ts.should(t, "edge", 0, desc("tier", "free"))
		if r := ts.should(t, "edge", 0, desc("tier", "free")); r.OverallCode != over {
			t.Fatalf("free tier alone: %v, want OVER_LIMIT", r.OverallCode)
		}
		r := ts.should(t, "edge", 0, desc("tier", "free"), desc("user", "vip"))
		if r.OverallCode != ok || r.Statuses[0].CurrentLimit != nil {
			t.Errorf("with the vip rule replacing free: %v, want OK", r)
		}
	})
}

func TestGRPCLimitOverride(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	d := desc("remote_address", "o")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	r := ts.should(t, "edge", 0, d)
	if r.OverallCode != ok || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 || r.Statuses[0].CurrentLimit.GetUnit() != rlspb.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("%v, want OK under 1/hour", r)
	}
	if r := ts.should(t, "edge", 0, d); r.OverallCode != over {
		t.Errorf("second request: %v, want OVER_LIMIT", r.OverallCode)
	}
	d.Limit.UnitMultiplier = wrapperspb.UInt32(0)
	_, err := ts.rls.ShouldRateLimit(ctxT(t), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("unit_multiplier 0: %v, want InvalidArgument", err)
	}
}

func TestGRPCNegativeHits(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	ts.should(t, "edge", 3, desc("remote_address", "n"))
	d := desc("remote_address", "n")
	d.HitsAddend, d.IsNegativeHits = wrapperspb.UInt64(2), true
	if r := ts.should(t, "edge", 0, d); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 2 {
		t.Errorf("negative hits: %v, want OK with 2 given back", r)
	}
}

func TestGRPCResponseHeaders(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig, func(o *Options) { o.ResponseHeaders = true })
	// Each field appears once, and parses under the draft's rules.
	fields := func(r *rlspb.RateLimitResponse) ([]headers.Policy, []headers.Limit) {
		t.Helper()
		policy, limit := rlsFields(t, r) // parsed there under the draft's rules
		ps, _ := headers.ParsePolicy(policy)
		ls, _ := headers.ParseRateLimit(limit)
		return ps, ls
	}
	r := ts.should(t, "edge", 0, desc("remote_address", "h"), desc("ldap", "x"))
	ps, ls := fields(r)
	// As httplimit advertises fleetrate.PerSecond(3, 3): its interval of
	// 333,333,334 ns refills only 2 tokens in any whole second.
	if len(ps) != 1 || ps[0].Name != "3/second" || ps[0].Quota != 2 || ps[0].Window != time.Second {
		t.Errorf("policies %+v, want \"3/second\";q=2;w=1", ps)
	}
	// The next token is a third of a second away: t is rounded down.
	if len(ls) != 1 || ls[0].Name != "3/second" || ls[0].Remaining != 2 || ls[0].Reset != 0 {
		t.Errorf("limits %+v, want \"3/second\";r=2;t=0", ls)
	}
	// A named limit and a denial: the denying limit is reported.
	ts.should(t, "edge", 0, desc("tier", "free"), desc("remote_address", "h"))
	r = ts.should(t, "edge", 0, desc("tier", "free"), desc("remote_address", "h"))
	ps, ls = fields(r)
	if r.OverallCode != over || len(ps) != 2 || ps[0].Name != "free" || ps[0].Window != time.Minute {
		t.Errorf("policies %+v, want free;q=1;w=60 and 3/second", ps)
	}
	if ls[0].Name != "free" || ls[0].Remaining != 0 || ls[0].Reset != time.Minute {
		t.Errorf("limits %+v, want \"free\";r=0;t=60", ls)
	}
}

// envoyXRateLimit applies the rules of Envoy's HTTP rate limit filter
// (enable_x_ratelimit_headers: DRAFT_VERSION_03, ratelimit_headers.cc) to
// an RLS response: of the statuses with a current_limit, the first with
// the fewest requests left gives X-RateLimit-Limit (its requests_per_unit,
// then ", <rpu>;w=<unit seconds>" and ";name=..." for every status),
// X-RateLimit-Remaining (its limit_remaining) and X-RateLimit-Reset (the
// seconds of its duration_until_reset, the nanoseconds dropped).
func envoyXRateLimit(r *rlspb.RateLimitResponse) (limit, remaining, reset string) {
	var pick *rlspb.RateLimitResponse_DescriptorStatus
	policy := ""
	for _, st := range r.Statuses {
		if st.CurrentLimit == nil {
			continue
		}
		if pick == nil || st.LimitRemaining < pick.LimitRemaining {
			pick = st
		}
		w := map[rlspb.RateLimitResponse_RateLimit_Unit]int{
			rlspb.RateLimitResponse_RateLimit_SECOND: 1, rlspb.RateLimitResponse_RateLimit_MINUTE: 60,
			rlspb.RateLimitResponse_RateLimit_HOUR: 3600, rlspb.RateLimitResponse_RateLimit_DAY: 86400,
		}[st.CurrentLimit.Unit]
		if w > 0 {
			policy += fmt.Sprintf(", %d;w=%d", st.CurrentLimit.RequestsPerUnit, w)
			if st.CurrentLimit.Name != "" {
				policy += fmt.Sprintf(";name=%q", st.CurrentLimit.Name)
			}
		}
	}
	if pick == nil {
		return "", "", ""
	}
	return fmt.Sprintf("%d%s", pick.CurrentLimit.RequestsPerUnit, policy),
		fmt.Sprint(pick.LimitRemaining), fmt.Sprint(pick.DurationUntilReset.GetSeconds())
}

// TestEnvoyHeadersOnA429 checks what Envoy puts on a 429 from fleetrate's
// answers: X-RateLimit-Remaining 0 and X-RateLimit-Reset at least 1, the
// wait rounded up, even when the bucket refills within a fraction of a
// second, and when a request asks for more than is left.
func TestEnvoyHeadersOnA429(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	tests := []struct {
		name               string
		hits               uint32
		ds                 []*rlcommon.RateLimitDescriptor
		limit, left, reset string
	}{
		// 3/second: the 4th hit waits 1/3 s.
		{"sub-second wait", 1, []*rlcommon.RateLimitDescriptor{desc("remote_address", "e")}, "3, 3;w=1", "0", "1"},
		// 2 left of 3, asking for 3: over, though 2 are left.
		{"more than is left", 3, []*rlcommon.RateLimitDescriptor{desc("remote_address", "f")}, "3, 3;w=1", "0", "1"},
		// requests_per_unit 0.
		{"denies everything", 1, []*rlcommon.RateLimitDescriptor{desc("remote_address", "50.0.0.5")}, "0, 0;w=1", "0", "1"},
	}
	ts.should(t, "edge", 3, desc("remote_address", "e"))
	ts.should(t, "edge", 1, desc("remote_address", "f"))
	for _, tt := range tests {
		r := ts.should(t, "edge", tt.hits, tt.ds...)
		if r.OverallCode != over {
			t.Fatalf("%s: %v, want OVER_LIMIT", tt.name, r)
		}
		limit, left, reset := envoyXRateLimit(r)
		if limit != tt.limit || left != tt.left || reset != tt.reset {
			t.Errorf("%s: Envoy would send X-RateLimit-Limit %q, -Remaining %q, -Reset %q; want %q, %q, %q",
				tt.name, limit, left, reset, tt.limit, tt.left, tt.reset)
		}
	}
}

func TestGRPCGlobalShadowMode(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig, func(o *Options) { o.ShadowMode = true })
	r := ts.should(t, "edge", 0, desc("remote_address", "50.0.0.5"))
	if r.OverallCode != ok || r.Statuses[0].Code != over {
		t.Errorf("%v, want overall OK with the descriptor's real OVER_LIMIT", r)
	}
}

func TestGRPCInvalidRequests(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	for _, tc := range []struct {
		name string
		req  *rlspb.RateLimitRequest
	}{
		{"missing domain", &rlspb.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("a", "b")}}},
		{"no descriptors", &rlspb.RateLimitRequest{Domain: "edge"}},
		{"empty descriptor", &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{}}}},
		{"empty key", &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("", "b")}}},
	} {
		_, err := ts.rls.ShouldRateLimit(ctxT(t), tc.req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", tc.name, err)
		}
	}
	if r := ts.should(t, "edge", 0, desc("remote_address", "still")); r.OverallCode != ok {
		t.Errorf("after bad requests: %v", r.OverallCode)
	}
}

func TestGRPCStoreDownIsAnErrorNotADenial(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig, func(o *Options) { o.Store = failingStore{} })
	_, err := ts.rls.ShouldRateLimit(ctxT(t), &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("remote_address", "x")}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("err = %v, want Unavailable", err)
	}
	// Descriptors that need no store still answer.
	if r := ts.should(t, "edge", 0, desc("ldap", "x")); r.OverallCode != ok {
		t.Errorf("unlimited with the store down: %v", r.OverallCode)
	}
	if !metricHas(t, ts, `fleetrate_store_errors_total{op="take"} 1`) {
		t.Error("store error not counted")
	}
}

func TestGRPCAuth(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig, func(o *Options) { o.AuthTokens = []string{"s3cret", "next"} })
	req := &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("remote_address", "x")}}
	if _, err := ts.rls.ShouldRateLimit(ctxT(t), req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no token: %v, want Unauthenticated", err)
	}
	bad := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer nope")
	if _, err := ts.rls.ShouldRateLimit(bad, req); status.Code(err) != codes.Unauthenticated {
		t.Errorf("wrong token: %v, want Unauthenticated", err)
	}
	good := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer next")
	if _, err := ts.rls.ShouldRateLimit(good, req); err != nil {
		t.Errorf("good token: %v", err)
	}
}

// TestEnvoyConfigIsATokenBucket loads an envoyproxy/ratelimit file as it
// is and checks it behaves as a token bucket: a full burst at once, then
// one request per requests_per_unit/unit, not a fixed window.
func TestEnvoyConfigIsATokenBucket(t *testing.T) {
	t.Parallel()
	ts := start(t, `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`)
	users := desc("database", "users")
	for i := 0; i < 10; i++ {
		if r := ts.should(t, "mongo_cps", 0, users); r.OverallCode != ok {
			t.Fatalf("burst request %d: %v", i, r.OverallCode)
		}
	}
	r := ts.should(t, "mongo_cps", 0, users)
	if r.OverallCode != over {
		t.Fatalf("11th: %v, want OVER_LIMIT", r.OverallCode)
	}
	if got := r.Statuses[0].DurationUntilReset.AsDuration(); got != 6*time.Second {
		t.Errorf("retry after %v, want 6s (one token per 60s/10)", got)
	}
	ts.clock.Advance(6 * time.Second)
	if r := ts.should(t, "mongo_cps", 0, users); r.OverallCode != ok {
		t.Errorf("after 6s: %v, want OK (a fixed window would wait for the minute)", r.OverallCode)
	}
	if r := ts.should(t, "mongo_cps", 0, users); r.OverallCode != over {
		t.Errorf("right after: %v, want OVER_LIMIT", r.OverallCode)
	}
	ts.clock.Advance(time.Minute)
	for i := 0; i < 10; i++ {
		if r := ts.should(t, "mongo_cps", 0, users); r.OverallCode != ok {
			t.Fatalf("after a full refill, request %d: %v", i, r.OverallCode)
		}
	}
	if r := ts.should(t, "mongo_cps", 0, users); r.OverallCode != over {
		t.Errorf("burst is capped at requests_per_unit: %v", r.OverallCode)
	}
}

func TestGRPCHealth(t *testing.T) {
	t.Parallel()
	ts := start(t, rlsConfig)
	conn, err := grpc.NewClient(ts.grpcAdr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	resp, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v, %v; want SERVING", resp, err)
	}
}
