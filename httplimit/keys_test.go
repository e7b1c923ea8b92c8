package httplimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate/memstore"
)

func mustPrefixes(t testing.TB, s ...string) []netip.Prefix {
	t.Helper()
	ps, err := ParsePrefixes(s...)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestClientIP(t *testing.T) {
	t.Parallel()
	trusted := mustPrefixes(t, "10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.1")
	tests := []struct {
		name   string
		cfg    IPConfig
		remote string
		hdr    map[string][]string
		want   string
	}{
		{"peer only", IPConfig{}, "203.0.113.9:5555", nil, "ip:203.0.113.9/32"},
		{"spoofed XFF from untrusted peer ignored", IPConfig{TrustedProxies: trusted}, "203.0.113.9:5555",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "ip:203.0.113.9/32"},
		{"spoofed Forwarded from untrusted peer ignored", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "203.0.113.9:5555",
			map[string][]string{"Forwarded": {"for=1.2.3.4"}}, "ip:203.0.113.9/32"},
		{"XFF ignored with no trusted proxies", IPConfig{}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "ip:10.0.0.1/32"},
		{"XFF via trusted proxy", IPConfig{TrustedProxies: trusted}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"198.51.100.7"}}, "ip:198.51.100.7/32"},
		{"client-forged entries left of the real hop ignored", IPConfig{TrustedProxies: trusted}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"6.6.6.6, 7.7.7.7, 198.51.100.7"}}, "ip:198.51.100.7/32"},
		{"chain of trusted proxies", IPConfig{TrustedProxies: trusted}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"6.6.6.6, 198.51.100.7, 10.1.1.1", "10.2.2.2"}}, "ip:198.51.100.7/32"},
		{"all hops trusted", IPConfig{TrustedProxies: trusted}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"10.9.9.9, 10.1.1.1"}}, "ip:10.9.9.9/32"},
		{"garbage hop stops at last trusted", IPConfig{TrustedProxies: trusted}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4, nonsense, 10.1.1.1"}}, "ip:10.1.1.1/32"},
		{"empty XFF via proxy", IPConfig{TrustedProxies: trusted}, "10.0.0.1:80", nil, "ip:10.0.0.1/32"},
		{"XFF with ports", IPConfig{TrustedProxies: trusted}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"198.51.100.7:4000"}}, "ip:198.51.100.7/32"},
		{"Forwarded via trusted proxy", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "192.0.2.1:443",
			map[string][]string{"Forwarded": {`for=6.6.6.6, for=198.51.100.7;proto=https;by=192.0.2.1`}}, "ip:198.51.100.7/32"},
		{"Forwarded quoted IPv6 with port", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "192.0.2.1:443",
			map[string][]string{"Forwarded": {`For="[2001:db8:cafe::17]:4711"`}}, "ip:2001:db8:cafe::/64"},
		{"Forwarded quoted comma is not a separator", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "192.0.2.1:443",
			map[string][]string{"Forwarded": {`for=198.51.100.7;ext="a,for=6.6.6.6"`}}, "ip:198.51.100.7/32"},
		{"Forwarded unknown stops", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "192.0.2.1:443",
			map[string][]string{"Forwarded": {`for=unknown`}}, "ip:192.0.2.1/32"},
		{"Forwarded obfuscated stops", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "10.0.0.1:443",
			map[string][]string{"Forwarded": {`for=198.51.100.7, for=_hidden, for=10.3.3.3`}}, "ip:10.3.3.3/32"},
		{"Forwarded element without for stops", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "10.0.0.1:443",
			map[string][]string{"Forwarded": {`for=198.51.100.7, proto=http`}}, "ip:10.0.0.1/32"},
		{"forged XFF ignored when proxies set Forwarded", IPConfig{TrustedProxies: trusted, Header: HeaderForwarded}, "10.0.0.1:443",
			map[string][]string{"Forwarded": {`for=198.51.100.7`}, "X-Forwarded-For": {"6.6.6.6"}}, "ip:198.51.100.7/32"},
		{"forged Forwarded ignored when proxies set XFF", IPConfig{TrustedProxies: trusted}, "10.0.0.1:443",
			map[string][]string{"Forwarded": {`for=6.6.6.6`}, "X-Forwarded-For": {"198.51.100.7"}}, "ip:198.51.100.7/32"},
		{"IPv6 grouped by /64", IPConfig{}, "[2001:db8:1:2:3:4:5:6]:443", nil, "ip:2001:db8:1:2::/64"},
		{"IPv6 per address", IPConfig{IPv6PrefixLen: 128}, "[2001:db8:1:2:3:4:5:6]:443", nil, "ip:2001:db8:1:2:3:4:5:6/128"},
		{"IPv4 grouped by /24", IPConfig{IPv4PrefixLen: 24}, "203.0.113.9:1", nil, "ip:203.0.113.0/24"},
		{"IPv4-mapped IPv6 peer is IPv4", IPConfig{}, "[::ffff:203.0.113.9]:1", nil, "ip:203.0.113.9/32"},
		{"IPv4-mapped trusted proxy", IPConfig{TrustedProxies: mustPrefixes(t, "::ffff:10.0.0.0/104")}, "10.0.0.1:80",
			map[string][]string{"X-Forwarded-For": {"198.51.100.7"}}, "ip:198.51.100.7/32"},
		{"zone dropped", IPConfig{}, "[fe80::1%eth0]:80", nil, "ip:fe80::/64"},
		{"trusted IPv6 proxy", IPConfig{TrustedProxies: trusted}, "[2001:db8:ffff::1]:80",
			map[string][]string{"X-Forwarded-For": {"2001:db8:1::9"}}, "ip:2001:db8:1::/64"},
		{"peer without port", IPConfig{}, "203.0.113.9", nil, "ip:203.0.113.9/32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := ClientIP(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tt.remote
			for k, vs := range tt.hdr {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got, err := f(r)
			if err != nil || got != tt.want {
				t.Errorf("ClientIP = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestClientIPErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []IPConfig{
		{Header: "X-Client-IP"}, // not one ClientIP knows
		{IPv4PrefixLen: 33},
		{IPv6PrefixLen: -1},
		{TrustedProxies: []netip.Prefix{{}}},
	} {
		if _, err := ClientIP(cfg); err == nil {
			t.Errorf("ClientIP(%+v) accepted an invalid config", cfg)
		}
	}
	if _, err := ParsePrefixes("10.0.0.0/8", "not-an-ip"); err == nil || !strings.Contains(err.Error(), "not-an-ip") {
		t.Errorf("ParsePrefixes error %v does not name the bad value", err)
	}
	f, _ := ClientIP(IPConfig{})
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "@"
	if _, err := f(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("unparsable peer: %v, want ErrNoKey", err)
	}
}

// TestSpoofedForwardingHeadersShareTheAttackersBucket sends requests from
// one untrusted peer with a different X-Forwarded-For each time: they must
// all draw from the peer's one bucket.
func TestSpoofedForwardingHeadersShareTheAttackersBucket(t *testing.T) {
	t.Parallel()
	c := newClock()
	key, err := ClientIP(IPConfig{TrustedProxies: mustPrefixes(t, "10.0.0.0/8")})
	if err != nil {
		t.Fatal(err)
	}
	cfg := memConfig(c)
	cfg.Key = key
	h := limited(t, cfg, messagesPolicy(), &okHandler{})
	admitted := 0
	for i := range 100 {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "203.0.113.9:40000"
		r.Header.Set("X-Forwarded-For", fmt.Sprintf("198.51.100.%d", i))
		r.Header.Set("Forwarded", fmt.Sprintf("for=198.51.100.%d", i))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code == http.StatusOK {
			admitted++
		}
	}
	if admitted != 20 {
		t.Errorf("admitted %d of 100 spoofed requests, want 20 (one bucket)", admitted)
	}
}

func TestAPIKeyHostileValues(t *testing.T) {
	t.Parallel()
	c := newClock()
	rec := &recordingStore{Store: memstore.New(memstore.Options{Clock: c.Now})}
	cfg := memConfig(c)
	cfg.Store = rec
	cfg.Prefix = "{fleet}:"
	h := limited(t, cfg, messagesPolicy(), &okHandler{})
	hostile := []string{
		"{tag}",
		"a}b{c",
		"key:with:colons",
		"line1\nline2",
		"crlf\r\nX-Injected: 1",
		"nul\x00byte",
		strings.Repeat("A", 10*1024),
		strings.Repeat("{", 10*1024),
		"../../etc/passwd",
		"*",
		"fleetrate:http:messages:apikey:0000",
		"ключ",
	}
	seen := map[string]string{}
	for _, k := range hostile {
		w := do(h, k)
		if w.Code != http.StatusOK {
			t.Fatalf("key %.20q: status %d", k, w.Code)
		}
		store := rec.lastKey()
		rest, ok := strings.CutPrefix(store, "{fleet}:messages:apikey:")
		if !ok || len(rest) != APIKeyHashLen || strings.Trim(rest, "0123456789abcdef") != "" {
			t.Errorf("key %.20q became store key %q, want the prefix and %d hex digits", k, store, APIKeyHashLen)
		}
		if strings.Count(store, "{") != 1 || strings.Count(store, "}") != 1 {
			t.Errorf("store key %q has a hash tag other than the prefix's", store)
		}
		if strings.Contains(store, k) && len(k) > 1 {
			t.Errorf("raw API key %.20q appears in store key %q", k, store)
		}
		if prev, dup := seen[store]; dup {
			t.Errorf("keys %.20q and %.20q share store key %q", prev, k, store)
		}
		seen[store] = k
	}
}

// TestDistinctKeysNeverShareABucket exhausts one client's bucket and
// checks that clients whose keys differ in any way are untouched.
func TestDistinctKeysNeverShareABucket(t *testing.T) {
	t.Parallel()
	c := newClock()
	victim := "key-" + strings.Repeat("x", 200)
	h := limited(t, memConfig(c), messagesPolicy(), &okHandler{})
	for range 20 {
		do(h, victim)
	}
	if w := do(h, victim); w.Code != http.StatusTooManyRequests {
		t.Fatalf("victim not limited: %d", w.Code)
	}
	for _, k := range []string{victim + "y", victim[:len(victim)-1], strings.ToUpper(victim), " " + victim + "x", "KEY-"} {
		if w := do(h, k); w.Code != http.StatusOK {
			t.Errorf("key %.30q shares the exhausted bucket: %d", k, w.Code)
		}
	}
}

// TestBucketNameInjective checks that distinct custom keys give distinct
// bucket names, including keys crafted to look like the escaped or
// hashed form of another key, and that no name holds a byte outside the
// safe set or is longer than the store allows.
func TestBucketNameInjective(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("z", 300)
	keys := []string{
		"a{b}", "a%7Bb%7D", "a%7bb%7d", "a b", "a%20b", "a+b",
		long, bucketName(long), "#" + bucketName(long)[1:], strings.Repeat("z", 129), strings.Repeat("z", 128),
		"", "%", "%25", "#", "\n", "%0A", "é", "%C3%A9",
		strings.Repeat("{", 43), strings.Repeat("{", 42),
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for range 2000 {
		b := make([]byte, rng.IntN(60))
		for i := range b {
			b[i] = "a{}%#:\n /Z9é"[rng.IntN(13)]
		}
		keys = append(keys, string(b))
	}
	names := map[string]string{}
	for _, k := range keys {
		n := bucketName(k)
		if prev, ok := names[n]; ok && prev != k {
			t.Fatalf("keys %q and %q share bucket name %q", prev, k, n)
		}
		names[n] = k
		if len(n) > 128 {
			t.Errorf("bucket name of %.20q is %d bytes", k, len(n))
		}
		for i := 0; i < len(n); i++ {
			if !safeByte(n[i]) && n[i] != '%' && !(i == 0 && n[i] == '#') {
				t.Fatalf("bucket name %q of %q has the unsafe byte %q", n, k, n[i])
			}
		}
	}
}

func TestPrincipalRouteFirstOf(t *testing.T) {
	t.Parallel()
	type userKey struct{}
	principal := Principal(func(ctx context.Context) (string, bool) {
		u, ok := ctx.Value(userKey{}).(string)
		return u, ok
	})
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, err := principal(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("no principal: %v", err)
	}
	r = r.WithContext(context.WithValue(r.Context(), userKey{}, "alice"))
	if got, err := principal(r); got != "user:alice" || err != nil {
		t.Errorf("principal = %q, %v", got, err)
	}
	if _, err := Principal(nil)(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("nil principal func: %v", err)
	}

	if _, err := Route()(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("route without pattern: %v", err)
	}
	r.Pattern = "POST /v1/messages"
	if got, _ := Route()(r); got != "route:POST /v1/messages" {
		t.Errorf("route = %q", got)
	}

	ip, _ := ClientIP(IPConfig{})
	first := FirstOf(APIKey("X-API-Key"), principal, ip)
	if got, _ := first(r); got != "user:alice" {
		t.Errorf("FirstOf without API key = %q, want the principal", got)
	}
	r.Header.Set("X-API-Key", "k")
	if got, _ := first(r); got != "apikey:"+HashKey("k") {
		t.Errorf("FirstOf with API key = %q", got)
	}
	boom := func(*http.Request) (string, error) { return "", errBoom }
	if _, err := FirstOf(boom, ip)(r); !errors.Is(err, errBoom) {
		t.Errorf("FirstOf did not stop at a real error: %v", err)
	}
	if _, err := FirstOf()(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("empty FirstOf: %v", err)
	}
}

func TestAPIKeyForms(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer  secret ")
	if got, _ := APIKey("authorization")(r); got != "apikey:"+HashKey("secret") {
		t.Errorf("bearer token key = %q", got)
	}
	r.Header.Add("X-API-Key", "a")
	r.Header.Add("X-API-Key", "b")
	if _, err := APIKey("X-API-Key")(r); !errors.Is(err, ErrNoKey) || !strings.Contains(err.Error(), "2 times") {
		t.Errorf("duplicate header: %v", err)
	}
	r.Header.Set("X-API-Key", "   ")
	if _, err := APIKey("X-API-Key")(r); !errors.Is(err, ErrNoKey) {
		t.Errorf("blank header: %v", err)
	}
}
