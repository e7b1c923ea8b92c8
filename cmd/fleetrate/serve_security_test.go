package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/remotestore"
)

// The attacker suite: "fleetrate serve" over a real redis-server, reached
// from this host's network address (not loopback, as a client on another
// host is), once as it starts by default (no tokens) and once with scoped
// tokens. Every attempt that must fail fails with 401 or 403, leaves
// Redis byte for byte as it was, is logged once ("refused") and counted
// once in fleetrate_refused_total; the legitimate paths (Envoy RLS, a
// Python worker's /v1/wait and cancel, a take and its refund, a Go worker
// through remotestore) still work.

const securityConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: minute, requests_per_unit: 60, burst: 40}
`

// configuredKey is booking_com/availability's store key.
const configuredKey = "fleetrate:{booking_com}/availability"

// networkIP is an address of this host other than loopback, or "" when
// it has none.
func networkIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	return ""
}

// attackTarget is one running service and what the attacker watches.
type attackTarget struct {
	t     *testing.T
	base  string // http://<network address>:port
	grpc  string
	logs  *serveLog
	redis *redistest.Server
}

func startAttackTarget(t *testing.T, args ...string) *attackTarget {
	t.Helper()
	ip := networkIP()
	if ip == "" {
		t.Skip("this host has no address but loopback: a client from the network cannot be played")
	}
	rs := redistest.Start(t)
	path := serveWriteFile(t, "fleetrate.yaml", securityConfig)
	args = append([]string{"--config", path, "--redis", rs.URL(), "--reload-interval", "0",
		"--http-addr", net.JoinHostPort(ip, "0"), "--grpc-addr", net.JoinHostPort(ip, "0")}, args...)
	httpAddr, grpcAddr, logs, stop := startServe(t, args...)
	t.Cleanup(func() { _ = stop() })
	return &attackTarget{t: t, base: "http://" + httpAddr, grpc: grpcAddr, logs: logs, redis: rs}
}

// call sends method path with body (nil for none) and token ("" for none),
// and returns the status and the JSON answer.
func (a *attackTarget) call(method, path, token string, body any) (int, map[string]any) {
	a.t.Helper()
	var r io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			a.t.Fatal(err)
		}
		r = bytes.NewReader(data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, r)
	if err != nil {
		a.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(data, &m)
	return resp.StatusCode, m
}

// snapshot is every key of Redis and its serialized value, and when each
// key expires (zero for none).
func (a *attackTarget) snapshot() (map[string]string, map[string]time.Time) {
	a.t.Helper()
	ctx := context.Background()
	c := a.redis.Client()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		a.t.Fatal(err)
	}
	out, expires := make(map[string]string, len(keys)), make(map[string]time.Time, len(keys))
	for _, k := range keys {
		v, err := c.Dump(ctx, k).Result()
		if err != nil {
			a.t.Fatalf("DUMP %q: %v", k, err)
		}
		out[k] = v
		if ttl, err := c.PTTL(ctx, k).Result(); err == nil && ttl > 0 {
			expires[k] = time.Now().Add(ttl)
		}
	}
	return out, expires
}

// unexpired drops from before the keys that expired by now: a bucket
// refilled while the attempts ran (on a loaded machine, they may take
// longer than its refill) is gone without anyone deleting it.
func unexpired(before map[string]string, expires map[string]time.Time) map[string]string {
	out := make(map[string]string, len(before))
	for k, v := range before {
		if e, ok := expires[k]; !ok || time.Now().Before(e.Add(-100*time.Millisecond)) {
			out[k] = v
		}
	}
	return out
}

// refusals are the "refused" log lines so far and the sum of
// fleetrate_refused_total.
func (a *attackTarget) refusals() (logged int, counted float64) {
	a.t.Helper()
	sc := bufio.NewScanner(strings.NewReader(a.logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "refused" {
			logged++
		}
	}
	resp, err := http.Get(a.base + "/metrics")
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc = bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "fleetrate_refused_total{") {
			var v float64
			fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			counted += v
		}
	}
	return logged, counted
}

// attempt is one try that must be refused.
type attempt struct {
	name, method, path, token string
	body                      any
	want                      int // 401 or 403
}

// mustRefuse runs each attempt and checks the refusal, the store, the log
// and the metric.
func (a *attackTarget) mustRefuse(attempts []attempt) {
	a.t.Helper()
	before, expires := a.snapshot()
	for _, at := range attempts {
		logged, counted := a.refusals()
		code, body := a.call(at.method, at.path, at.token, at.body)
		if code != at.want {
			a.t.Errorf("%s: %s %s answered %d %v, want %d", at.name, at.method, at.path, code, body, at.want)
		}
		logged2, counted2 := a.refusals()
		if logged2 != logged+1 || counted2 != counted+1 {
			a.t.Errorf("%s: logged %d times, counted %v times, want once each", at.name, logged2-logged, counted2-counted)
		}
	}
	after, _ := a.snapshot()
	if before = unexpired(before, expires); !mapsEqual(before, unexpired(after, expires)) {
		a.t.Errorf("the refused attempts changed Redis: keys before %v, after %v", keysOf(before), keysOf(after))
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func keysOf(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

var configuredLimits = []map[string]any{{"rate": 1.0, "burst": 40}}

// attacks are the attempts every caller without the right scope makes
// with token (forged, replayed and foreign grants come separately).
func attacks(token string, want int) []attempt {
	bucket := map[string]any{"bucket": "booking_com/availability"}
	raw := []map[string]any{{"prefix": "fleetrate:", "key": "{booking_com}/availability", "limits": []map[string]any{{"rate": 1000, "burst": 1000000}}}}
	own := []map[string]any{{"prefix": "fleetrate:", "key": "mine", "limits": []map[string]any{{"rate": 1, "burst": 5}}}}
	return []attempt{
		{"reset", "POST", "/v1/reset", token, bucket, want},
		{"drain", "POST", "/v1/drain", token, map[string]any{"bucket": "booking_com/availability", "pause_ms": 60000}, want},
		{"config", "GET", "/v1/config", token, nil, want},
		{"status page", "GET", "/status/", token, nil, want},
		{"refund without grant", "POST", "/v1/refund", token, map[string]any{"bucket": "booking_com/availability", "n": 40, "at_unix_micro": time.Now().UnixMicro()}, want},
		{"cancel without grant", "POST", "/v1/cancel", token, map[string]any{"bucket": "booking_com/availability", "n": 40, "booking": map[string]any{"stamp_unix_micro": time.Now().UnixMicro(), "debts_ns": []int64{1e9}}}, want},
		{"raw take, own limits on a configured bucket", "POST", "/v1/store/take", token, map[string]any{"buckets": raw, "n": 1}, want},
		{"raw reset of a configured bucket", "POST", "/v1/store/reset", token, map[string]any{"keys": []string{configuredKey}}, want},
		{"raw drain of a configured bucket", "POST", "/v1/store/drain", token, map[string]any{"buckets": []map[string]any{{"prefix": "fleetrate:", "key": "{booking_com}/availability", "limits": configuredLimits}}, "duration_ns": 6e10}, want},
		{"raw refund without grant", "POST", "/v1/store/refund", token, map[string]any{"buckets": own, "n": 5, "at_unix_micro": time.Now().UnixMicro()}, want},
		{"raw take of an RLS rule's key", "POST", "/v1/store/take", token, map[string]any{"buckets": []map[string]any{{"prefix": "fleetrate:", "key": "rls:edge:remote_address=1.2.3.4", "limits": []map[string]any{{"rate": 1, "burst": 1000}}}}, "n": 1}, want},
	}
}

// grantAttacks are forged, replayed and tampered give-backs with token: a
// take is granted and refunded once (legitimately) first.
func (a *attackTarget) grantAttacks(token string) []attempt {
	a.t.Helper()
	code, d := a.call("POST", "/v1/take", token, map[string]any{"bucket": "booking_com/availability", "n": 2})
	grant, _ := d["grant"].(string)
	if code != 200 || grant == "" {
		a.t.Fatalf("/v1/take: %d %v, want a grant", code, d)
	}
	if code, m := a.call("POST", "/v1/refund", token, map[string]any{"bucket": "booking_com/availability", "grant": grant}); code != 200 {
		a.t.Fatalf("refund with the take's grant: %d %v", code, m)
	}
	_, d2 := a.call("POST", "/v1/take", token, map[string]any{"bucket": "booking_com/availability", "n": 1})
	fresh, _ := d2["grant"].(string)
	tampered := []byte(fresh)
	tampered[10] ^= 1
	_, w := a.call("POST", "/v1/wait", token, map[string]any{"bucket": "booking_com/availability", "n": 1})
	booking, _ := w["booking"].(map[string]any)
	if booking == nil {
		a.t.Fatalf("/v1/wait: %v, want a booking", w)
	}
	inflated := map[string]any{}
	for k, v := range booking {
		inflated[k] = v
	}
	inflated["debts_ns"] = []int64{int64(time.Hour)}
	return []attempt{
		{"replayed refund", "POST", "/v1/refund", token, map[string]any{"bucket": "booking_com/availability", "grant": grant}, 403},
		{"forged grant", "POST", "/v1/refund", token, map[string]any{"bucket": "booking_com/availability", "grant": strings.Repeat("A", 94)}, 403},
		{"tampered grant", "POST", "/v1/refund", token, map[string]any{"bucket": "booking_com/availability", "grant": string(tampered)}, 403},
		{"grant for more tokens", "POST", "/v1/refund", token, map[string]any{"bucket": "booking_com/availability", "grant": fresh, "n": 40}, 403},
		{"cancel with a refund's grant", "POST", "/v1/cancel", token, map[string]any{"bucket": "booking_com/availability", "n": 1, "booking": map[string]any{"stamp_unix_micro": 1, "debts_ns": []int64{1}, "grant": fresh}}, 403},
		{"cancel of other debts", "POST", "/v1/cancel", token, map[string]any{"bucket": "booking_com/availability", "n": 1, "booking": inflated}, 403},
	}
}

func TestServeSecurityDefaultStart(t *testing.T) {
	t.Parallel()
	a := startAttackTarget(t)
	if _, ok := a.logs.field("access: no tokens: the decision path (RLS, /json, /v1/take, /v1/wait, give-backs with a grant) is open to every client;"+
		" reset, drain, give-backs without a grant, /v1/config, the status page and the raw store API are served to loopback clients only."+
		" To open them, give tokens with the store or admin scope (--auth-token-file), or start with --allow-unauthenticated-admin-from-network", "addr"); !ok {
		t.Errorf("no startup line says how to open the admin and store APIs:\n%s", a.logs.String())
	}
	// Spend some tokens first, so that a reset or refund would show.
	for range 3 {
		if code, m := a.call("POST", "/v1/take", "", map[string]any{"bucket": "booking_com/availability", "n": 10}); code != 200 {
			t.Fatalf("take: %d %v", code, m)
		}
	}
	a.mustRefuse(append(attacks("", 403), a.grantAttacks("")...))
	a.legitimate("", "")
	// A Go worker through remotestore needs the store scope: from the
	// network, without tokens, it is refused.
	rs, err := remotestore.New(a.base, remotestore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	_, err = rs.Take(context.Background(), fleetrate.Request{N: 1, Buckets: []fleetrate.Bucket{{Prefix: "fleetrate:", Key: "go-worker", Limits: []fleetrate.Limit{{Rate: 1, Burst: 5}}}}})
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("remotestore from the network without tokens: %v, want a refusal naming loopback", err)
	}
}

func TestServeSecurityWithTokens(t *testing.T) {
	t.Parallel()
	tokens := serveWriteFile(t, "tokens", "# a worker, another, a remotestore worker, an operator\n"+
		"dec-token decide\ndec-other decide\nsto-token store\nadm-token admin\nold-token\n")
	a := startAttackTarget(t, "--auth-token-file", tokens)
	for range 3 {
		if code, m := a.call("POST", "/v1/take", "dec-token", map[string]any{"bucket": "booking_com/availability", "n": 10}); code != 200 {
			t.Fatalf("take: %d %v", code, m)
		}
	}
	var all []attempt
	for _, tc := range []struct {
		token string
		want  int
	}{{"", 401}, {"wrong-token", 401}, {"dec-token", 403}} {
		all = append(all, attacks(tc.token, tc.want)...)
	}
	// The store scope: the raw API, but not a configured bucket's limits,
	// reset or drain, a give-back without a grant, nor the admin
	// endpoints.
	all = append(all, attacks("sto-token", 403)...)
	// No token, a wrong one and a store-only one are refused the decision
	// path too.
	take := map[string]any{"bucket": "booking_com/availability"}
	all = append(all,
		attempt{"take without a token", "POST", "/v1/take", "", take, 401},
		attempt{"take with a wrong token", "POST", "/v1/take", "wrong-token", take, 401},
		attempt{"take with the store scope only", "POST", "/v1/take", "sto-token", take, 403},
	)
	all = append(all, a.grantAttacks("dec-token")...)
	// Someone else's grant: dec-other gives back dec-token's take.
	_, d := a.call("POST", "/v1/take", "dec-token", map[string]any{"bucket": "booking_com/availability", "n": 1})
	all = append(all, attempt{"someone else's grant", "POST", "/v1/refund", "dec-other", map[string]any{"bucket": "booking_com/availability", "grant": d["grant"]}, 403})
	a.mustRefuse(all)

	// gRPC: no token, a wrong one, and a store-only token are refused.
	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlspb.NewRateLimitServiceClient(conn)
	for _, tc := range []struct {
		token string
		want  codes.Code
	}{{"", codes.Unauthenticated}, {"wrong-token", codes.Unauthenticated}, {"sto-token", codes.PermissionDenied}, {"adm-token", codes.PermissionDenied}} {
		logged, counted := a.refusals()
		_, err := rls.ShouldRateLimit(withBearer(t, tc.token), rlsRequest())
		if status.Code(err) != tc.want {
			t.Errorf("RLS with token %q: %v, want %v", tc.token, err, tc.want)
		}
		if l, c := a.refusals(); l != logged+1 || c != counted+1 {
			t.Errorf("RLS with token %q: logged %d, counted %v, want once each", tc.token, l-logged, c-counted)
		}
	}
	a.legitimate("dec-token", "adm-token")
	// A token without scopes listed gets decide and store: a worker's.
	if code, m := a.call("POST", "/v1/take", "old-token", take); code != 200 {
		t.Errorf("take with a token without scopes: %d %v", code, m)
	}
	if code, m := a.call("POST", "/v1/reset", "old-token", take); code != 403 {
		t.Errorf("reset with a token without scopes: %d %v, want 403", code, m)
	}
	a.goWorker("sto-token")
}

// legitimate checks the paths that must keep working: Envoy RLS, a
// Python worker's wait and cancel, a take and its refund, and (with
// admin, a token with the admin scope) a reset.
func (a *attackTarget) legitimate(decide, admin string) {
	t := a.t
	t.Helper()
	conn, err := grpc.NewClient(a.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(withBearer(t, decide), rlsRequest())
	if err != nil || resp.GetOverallCode() != rlspb.RateLimitResponse_OK {
		t.Errorf("Envoy RLS: %v %v, want OK", resp, err)
	}
	// As examples/python/decide_worker.py does: wait, then cancel the booking it
	// got back unchanged.
	code, w := a.call("POST", "/v1/wait", decide, map[string]any{"bucket": "booking_com/availability", "n": 1, "max_wait_ms": 2000})
	if code != 200 || w["allowed"] != true {
		t.Fatalf("/v1/wait: %d %v", code, w)
	}
	if code, m := a.call("POST", "/v1/cancel", decide, map[string]any{"bucket": "booking_com/availability", "n": 1, "booking": w["booking"]}); code != 200 {
		t.Errorf("/v1/cancel with the wait's booking: %d %v", code, m)
	}
	_, d := a.call("POST", "/v1/take", decide, map[string]any{"bucket": "booking_com/availability", "n": 1})
	if code, m := a.call("POST", "/v1/refund", decide, map[string]any{"bucket": "booking_com/availability", "n": 1, "at_unix_micro": d["at_unix_micro"], "grant": d["grant"]}); code != 200 {
		t.Errorf("/v1/refund with the take's grant: %d %v", code, m)
	}
	if admin != "" {
		if code, m := a.call("POST", "/v1/reset", admin, map[string]any{"bucket": "booking_com/availability"}); code != 200 {
			t.Errorf("/v1/reset with the admin scope: %d %v", code, m)
		}
		if code, m := a.call("GET", "/status/", admin, nil); code != 200 {
			t.Errorf("/status/ with the admin scope: %d %v", code, m)
		}
	}
}

// goWorker checks a Go worker through remotestore with a store token:
// its own bucket, a configured one with the configuration's limits, and
// the refund of a take, which presents the take's grant.
func (a *attackTarget) goWorker(token string) {
	t := a.t
	rs, err := remotestore.New(a.base, remotestore.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	ctx := context.Background()
	own := fleetrate.Bucket{Prefix: "fleetrate:", Key: "go-worker", Limits: []fleetrate.Limit{{Rate: 1, Burst: 5}}}
	res, err := rs.Take(ctx, fleetrate.Request{N: 5, Buckets: []fleetrate.Bucket{own}})
	if err != nil || !res.Allowed {
		t.Fatalf("remotestore take: %+v %v", res, err)
	}
	if err := rs.Refund(ctx, []fleetrate.Bucket{own}, 5, res.At); err != nil {
		t.Errorf("remotestore refund of its take: %v", err)
	}
	if err := rs.Refund(ctx, []fleetrate.Bucket{own}, 5, res.At); err == nil {
		t.Error("remotestore refund of the same take twice: no error")
	}
	lim, err := fleetrate.New(rs, fleetrate.Config{Prefix: "fleetrate:", Limits: []fleetrate.Limit{{Rate: 1, Burst: 40}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(ctx, "{booking_com}/availability"); err != nil {
		t.Errorf("remotestore on a configured bucket with its limits: %v", err)
	}
}

func withBearer(t *testing.T, token string) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	if token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
}

func rlsRequest() *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}},
	}}}
}
