package server

import (
	"math"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/redisstore"
)

// headersConfig holds the shapes the RLS headers are checked on: the
// rules of a black-box tester's reports.
const headersConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 1, burst: 3}
  - key: six
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: a
    rate_limits:
      - {name: sec, unit: second, requests_per_unit: 10}
      - {name: min, unit: minute, requests_per_unit: 30}
  - key: dup
    rate_limits:
      - {name: sec, unit: second, requests_per_unit: 5}
`

// headerStores runs f against a server with --response-headers over the
// memory store (on a manual clock) and over a real redis-server (on real
// time: f must then assert nothing that depends on elapsed time).
func headerStores(t *testing.T, f func(t *testing.T, ts *testServer, manual bool)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, start(t, headersConfig, func(o *Options) { o.ResponseHeaders = true }), true)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rs := redistest.Start(t)
		client := redis.NewClient(&redis.Options{Addr: rs.Addr()})
		t.Cleanup(func() { client.Close() })
		store, err := redisstore.New(client, redisstore.Options{Timeout: -1})
		if err != nil {
			t.Fatal(err)
		}
		f(t, start(t, headersConfig, func(o *Options) {
			o.ResponseHeaders = true
			o.Store, o.StoreName = store, rs.URL()
			o.StoreTimeout = 30 * time.Second
		}), false)
	})
}

// rlsFields returns the RateLimit-Policy and RateLimit values of a
// response, checking that each appears once and parses under the draft's
// rules.
func rlsFields(t *testing.T, r *rlspb.RateLimitResponse) (policy, limit string) {
	t.Helper()
	got := map[string][]string{}
	for _, h := range r.ResponseHeadersToAdd {
		got[h.Key] = append(got[h.Key], h.Value)
	}
	if len(got) != 2 || len(got[HeaderRateLimitPolicy]) != 1 || len(got[HeaderRateLimit]) != 1 {
		t.Fatalf("headers %v, want one RateLimit-Policy and one RateLimit", got)
	}
	policy, limit = got[HeaderRateLimitPolicy][0], got[HeaderRateLimit][0]
	ps, err := headers.ParsePolicy(policy)
	if err != nil {
		t.Fatalf("RateLimit-Policy %q: %v", policy, err)
	}
	ls, err := headers.ParseRateLimit(limit)
	if err != nil {
		t.Fatalf("RateLimit %q: %v", limit, err)
	}
	named := false
	for _, p := range ps {
		named = named || p.Name == ls[0].Name
	}
	if len(ls) != 1 || !named {
		t.Fatalf("RateLimit %q names no item of RateLimit-Policy %q", limit, policy)
	}
	return policy, limit
}

// TestRLSRateLimitTIsRoundedDown checks "t" on grants: the time to the
// next token rounded down, as httplimit sends it for the same bucket
// (httplimit's TestEffectiveWindow), never rounded up. A 10/s burst 20
// bucket's next token is always under a second away: t=0.
func TestRLSRateLimitTIsRoundedDown(t *testing.T) {
	t.Parallel()
	headerStores(t, func(t *testing.T, ts *testServer, manual bool) {
		for i := range 20 {
			r := ts.should(t, "edge", 1, desc("remote_address", "10.9.9.8"))
			policy, limit := rlsFields(t, r)
			// On real time a token may come back during the loop: r is
			// exact on the manual clock only.
			want := `"10/second burst 20";r=` + strconv.Itoa(19-i) + `;t=0`
			if ls, _ := headers.ParseRateLimit(limit); !manual && ls[0].Remaining >= int64(19-i) {
				want = limit[:len(limit)-len(";t=0")] + ";t=0"
			}
			if r.OverallCode != ok || policy != `"10/second burst 20";q=20;w=2` || limit != want {
				t.Fatalf("take %d: %v %q %q, want OK with %q", i+1, r.OverallCode, policy, limit, want)
			}
		}
		// One token a minute, burst 3: the next token is a minute away.
		r := ts.should(t, "edge", 1, desc("slow", "s"))
		if policy, limit := rlsFields(t, r); policy != `"1/minute burst 3";q=3;w=180` || limit != `"1/minute burst 3";r=2;t=60` {
			t.Errorf("first take of 1/minute burst 3: %q %q, want r=2;t=60", policy, limit)
		}
		if !manual {
			return
		}
		steps := []struct {
			advance time.Duration
			code    rlspb.RateLimitResponse_Code
			limit   string
			reset   int64
		}{
			{0, ok, `"1/minute burst 3";r=1;t=60`, 120},
			{30 * time.Second, ok, `"1/minute burst 3";r=0;t=30`, 150},
			{0, over, `"1/minute burst 3";r=0;t=30`, 30},
			{29 * time.Second, over, `"1/minute burst 3";r=0;t=1`, 1},
			{time.Second, ok, `"1/minute burst 3";r=0;t=60`, 180},
		}
		for i, st := range steps {
			ts.clock.Advance(st.advance)
			r := ts.should(t, "edge", 1, desc("slow", "s"))
			_, limit := rlsFields(t, r)
			if r.OverallCode != st.code || limit != st.limit || r.Statuses[0].DurationUntilReset.GetSeconds() != st.reset {
				t.Errorf("step %d: %v %q reset %v; want %v %q reset %ds", i, r.OverallCode, limit, r.Statuses[0].DurationUntilReset.AsDuration(), st.code, st.limit, st.reset)
			}
		}
	})
}

// TestRLSRateLimitPolicyListsEveryLimit checks that RateLimit-Policy
// lists every limit of a rule, on every response, whichever limit decides.
func TestRLSRateLimitPolicyListsEveryLimit(t *testing.T) {
	t.Parallel()
	headerStores(t, func(t *testing.T, ts *testServer, manual bool) {
		const want = `"sec";q=10;w=1, "min";q=30;w=60`
		names := map[string]bool{}
		var overs int
		for i := range 45 {
			r := ts.should(t, "edge", 1, desc("a", "1"))
			policy, limit := rlsFields(t, r)
			if policy != want {
				t.Fatalf("response %d: RateLimit-Policy %q, want %q", i+1, policy, want)
			}
			ls, _ := headers.ParseRateLimit(limit)
			names[ls[0].Name] = true
			if r.OverallCode == over {
				overs++
			}
			if manual && i%10 == 9 {
				ts.clock.Advance(time.Second) // the per-minute limit decides from the 30th
			}
		}
		if manual && (!names["sec"] || !names["min"] || overs == 0) {
			t.Errorf("RateLimit named %v, %d denials; want both limits to decide in turn", names, overs)
		}
		// Limits of two rules with the same name get distinct items (one
		// rule may not name two limits alike: see internal/config).
		r := ts.should(t, "edge", 1, desc("a", "3"), desc("dup", "1"))
		if policy, _ := rlsFields(t, r); policy != `"sec";q=10;w=1, "min";q=30;w=60, "sec (5/second)";q=5;w=1` {
			t.Errorf("same-named limits: RateLimit-Policy %q", policy)
		}
		// Several descriptors: the items of each rule, in request order.
		r = ts.should(t, "edge", 1, desc("slow", "p"), desc("a", "2"))
		if policy, _ := rlsFields(t, r); policy != `"1/minute burst 3";q=3;w=180, "sec";q=10;w=1, "min";q=30;w=60` {
			t.Errorf("two descriptors: RateLimit-Policy %q", policy)
		}
	})
}

// TestRLSCostAboveBurst checks a request that costs more than the burst:
// OVER_LIMIT with no duration_until_reset (no wait admits it, as httplimit
// sends no Retry-After), and a RateLimit field read with a peek that took
// nothing.
func TestRLSCostAboveBurst(t *testing.T) {
	t.Parallel()
	headerStores(t, func(t *testing.T, ts *testServer, manual bool) {
		huge := desc("remote_address", "h64")
		huge.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
		for _, tc := range []struct {
			name string
			hits uint32
			d    *rlcommon.RateLimitDescriptor
		}{
			{"hits_addend 21", 21, desc("remote_address", "h21")},
			{"hits_addend 2^32-1", math.MaxUint32, desc("remote_address", "h32")},
			{"descriptor hits_addend 2^64-1", 1, huge},
		} {
			r := ts.should(t, "edge", tc.hits, tc.d)
			st := r.Statuses[0]
			if r.OverallCode != over || st.Code != over || st.LimitRemaining != 0 || st.DurationUntilReset != nil {
				t.Errorf("%s: %v, want OVER_LIMIT with no duration_until_reset", tc.name, r)
			}
			if _, limit := rlsFields(t, r); limit != `"10/second burst 20";r=20;t=0` {
				t.Errorf("%s: RateLimit %q, want the untouched bucket, r=20;t=0", tc.name, limit)
			}
			if _, _, reset := envoyXRateLimit(r); reset != "0" {
				t.Errorf("%s: Envoy would send X-RateLimit-Reset %q, want 0 (protobuf reads an unset duration as 0)", tc.name, reset)
			}
		}
		// Nothing was taken.
		if r := ts.should(t, "edge", 1, desc("remote_address", "h21")); r.Statuses[0].LimitRemaining != 19 {
			t.Errorf("after the refusals: %v, want 19 left", r)
		}
	})
}

// TestRLSGivenBackReportsTheBucketAfter checks that in a denied request of
// several descriptors, a descriptor whose tokens were given back reports
// its bucket after the refund, as a peek right after does.
func TestRLSGivenBackReportsTheBucketAfter(t *testing.T) {
	t.Parallel()
	headerStores(t, func(t *testing.T, ts *testServer, manual bool) {
		for range 6 {
			ts.should(t, "edge", 1, desc("six", "s1"))
		}
		r := ts.should(t, "edge", 1, desc("six", "s1"), desc("remote_address", "9.9.9.1"))
		if r.OverallCode != over || r.Statuses[0].Code != over {
			t.Fatalf("%v, want OVER_LIMIT by the exhausted descriptor", r)
		}
		st := r.Statuses[1]
		peek := desc("remote_address", "9.9.9.1")
		peek.HitsAddend = wrapperspb.UInt64(0)
		p := ts.should(t, "edge", 1, peek).Statuses[0]
		if st.Code != ok || st.LimitRemaining != 20 || st.DurationUntilReset.AsDuration() != 0 {
			t.Errorf("given back: %v, want OK, 20 left, 0s to full", st)
		}
		if p.LimitRemaining != st.LimitRemaining || p.DurationUntilReset.AsDuration() != st.DurationUntilReset.AsDuration() {
			t.Errorf("given back: %v; a peek right after: %v", st, p)
		}
		// The RateLimit field reports the denying descriptor.
		if _, limit := rlsFields(t, r); limit[:len(`"6/minute";r=0;t=`)] != `"6/minute";r=0;t=` {
			t.Errorf("RateLimit %q, want the exhausted 6/minute", limit)
		}
	})
}
