package httplimit_test

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/httplimit"
	"github.com/fleetrate/fleetrate/memstore"
)

// Limit POST /v1/messages to 1 request per second with a burst of 2 per
// API key. The store's clock is frozen so that the output is stable.
func Example() {
	frozen := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Options{Clock: func() time.Time { return frozen }})

	m, err := httplimit.New(httplimit.Config{Store: store, Key: httplimit.APIKey("X-API-Key")})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := m.Limit(httplimit.Policy{
		Name:   "messages",
		Limits: []fleetrate.Limit{fleetrate.PerSecond(1, 2)},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/messages", limit(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))

	for range 3 {
		r := httptest.NewRequest(http.MethodPost, "/v1/messages", nil)
		r.Header.Set("X-API-Key", "sk_test_123")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
		if w.Code == http.StatusTooManyRequests {
			body, _ := io.ReadAll(w.Body)
			fmt.Print("Retry-After: ", w.Header().Get("Retry-After"), "\n", string(body))
		}
	}
	// Output:
	// 201 "messages";q=2;w=2 "messages";r=1;t=1
	// 201 "messages";q=2;w=2 "messages";r=0;t=1
	// 429 "messages";q=2;w=2 "messages";r=0;t=1
	// Retry-After: 1
	// {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"the quota of policy \"messages\" (2 requests per 2s) is exhausted for this client; retry in 1 s","violated-policies":["messages"]}
}

// Key clients by IP address behind a load balancer at 10.0.0.0/8 that
// appends to X-Forwarded-For; a forged X-Forwarded-For from anywhere else
// is ignored.
func ExampleClientIP() {
	trusted, err := httplimit.ParsePrefixes("10.0.0.0/8")
	if err != nil {
		log.Fatal(err)
	}
	key, err := httplimit.ClientIP(httplimit.IPConfig{TrustedProxies: trusted})
	if err != nil {
		log.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.1.2.3:51234" // the load balancer
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 198.51.100.7")
	fmt.Println(key(r))

	r.RemoteAddr = "203.0.113.9:40000" // a client talking to us directly
	fmt.Println(key(r))
	// Output:
	// ip:198.51.100.7/32 <nil>
	// ip:203.0.113.9/32 <nil>
}

// Limit uploads to 100 KiB per client, refilled at 10 KiB a second,
// charging one token per started KiB. UnitsPerToken makes the headers count
// bytes, as the "content-bytes" unit says, and a body larger than the whole
// budget is answered 413 Content Too Large.
func ExamplePolicy_bodySize() {
	frozen := time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC)
	store := memstore.New(memstore.Options{Clock: func() time.Time { return frozen }})
	m, err := httplimit.New(httplimit.Config{Store: store, Key: httplimit.APIKey("X-API-Key")})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := m.Limit(httplimit.Policy{
		Name:          "upload",
		Limits:        []fleetrate.Limit{fleetrate.PerSecond(10, 100)},
		Cost:          httplimit.BodySize(1024, 1<<20),
		Unit:          "content-bytes",
		UnitsPerToken: 1024,
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 1<<20))
	})))
	defer srv.Close()

	for _, size := range []int{30 * 1024, 200 * 1024} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(make([]byte, size)))
		req.Header.Set("X-API-Key", "sk_test_123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		_ = resp.Body.Close()
		fmt.Println(size, resp.StatusCode, resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"))
	}
	// Output:
	// 30720 200 "upload";q=102400;qu="content-bytes";w=10 "upload";r=71680;t=0
	// 204800 413 "upload";q=102400;qu="content-bytes";w=10 "upload";r=71680;t=0
}

// Charge requests by body size: one token per started KiB, for a policy
// measured in content bytes.
func ExampleBodySize() {
	cost := httplimit.BodySize(1024, 1<<20)
	r := httptest.NewRequest(http.MethodPost, "/upload", nil)
	r.ContentLength = 2500
	fmt.Println(cost(r))
	// Output: 3 <nil>
}

// Give each plan its own limits: the tier function reads the caller's plan
// (here from a header that an auth middleware would have checked), and each
// tier has its own buckets and header item, "api.free" or "api.paid".
func ExamplePolicy_tiers() {
	m, err := httplimit.New(httplimit.Config{
		Store: memstore.New(memstore.Options{}),
		Key:   httplimit.APIKey("X-API-Key"),
	})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := m.Limit(httplimit.Policy{
		Name: "api",
		Tiers: []httplimit.Tier{
			{Name: "free", Limits: []fleetrate.Limit{fleetrate.PerPeriod(100, time.Hour)}},
			{Name: "paid", Limits: []fleetrate.Limit{fleetrate.PerPeriod(10_000, time.Hour)}},
		},
		Tier: func(r *http.Request) (string, error) { return r.Header.Get("X-Plan"), nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	for _, plan := range []string{"free", "paid"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-API-Key", "sk_test_123")
		req.Header.Set("X-Plan", plan)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		_ = resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "api.free";q=100;w=3600
	// 200 "api.paid";q=10000;w=3600
}

// Exempt an internal API key and the health check from every limit.
func ExampleExemptions() {
	m, err := httplimit.New(httplimit.Config{
		Store: memstore.New(memstore.Options{}),
		Key:   httplimit.APIKey("X-API-Key"),
		Exempt: httplimit.Exemptions{
			Keys: []string{"apikey:" + httplimit.HashKey("sk_internal_monitor")},
			Func: func(r *http.Request) bool { return r.URL.Path == "/healthz" },
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := m.Limit(httplimit.Policy{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerPeriod(1, time.Hour)}})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	for _, c := range []struct{ path, key string }{
		{"/v1", "sk_customer"}, {"/v1", "sk_customer"},
		{"/v1", "sk_internal_monitor"}, {"/v1", "sk_internal_monitor"},
		{"/healthz", "sk_customer"},
	} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+c.path, nil)
		req.Header.Set("X-API-Key", c.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		_ = resp.Body.Close()
		fmt.Println(c.path, c.key, resp.StatusCode)
	}
	// Output:
	// /v1 sk_customer 200
	// /v1 sk_customer 429
	// /v1 sk_internal_monitor 200
	// /v1 sk_internal_monitor 200
	// /healthz sk_customer 200
}

// Answer refusals in your API's own error format; the RateLimit fields and
// Retry-After are already set when Refused is called.
func ExampleConfig_refused() {
	m, err := httplimit.New(httplimit.Config{
		Store: memstore.New(memstore.Options{}),
		Key:   httplimit.APIKey("X-API-Key"),
		Refused: func(w http.ResponseWriter, _ *http.Request, ref httplimit.Refusal) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(ref.Status)
			fmt.Fprintf(w, `{"error":{"code":"rate_limited","policy":%q}}`+"\n", ref.Policy)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	limit, err := m.Limit(httplimit.Policy{Name: "api", Limits: []fleetrate.Limit{fleetrate.PerPeriod(1, time.Hour)}})
	if err != nil {
		log.Fatal(err)
	}
	srv := httptest.NewServer(limit(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	for range 2 {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header.Set("X-API-Key", "sk_test_123")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		fmt.Printf("%d Retry-After=%q body=%s\n", resp.StatusCode, resp.Header.Get("Retry-After"), bytes.TrimSpace(body))
	}
	// Output:
	// 200 Retry-After="" body=
	// 429 Retry-After="3600" body={"error":{"code":"rate_limited","policy":"api"}}
}

// Behind Cloudflare, key clients by CF-Connecting-IP, believed only from
// Cloudflare's own networks (list them all from
// https://www.cloudflare.com/ips/; two are shown).
func ExampleIPConfig_cdn() {
	cloudflare, err := httplimit.ParsePrefixes("173.245.48.0/20", "2400:cb00::/32")
	if err != nil {
		log.Fatal(err)
	}
	key, err := httplimit.ClientIP(httplimit.IPConfig{TrustedProxies: cloudflare, Header: httplimit.HeaderCFConnectingIP})
	if err != nil {
		log.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("CF-Connecting-IP", "198.51.100.7")
	r.RemoteAddr = "173.245.48.10:443" // Cloudflare
	fmt.Println(key(r))
	r.RemoteAddr = "203.0.113.9:40000" // someone forging the header
	fmt.Println(key(r))
	// Output:
	// ip:198.51.100.7/32 <nil>
	// ip:203.0.113.9/32 <nil>
}
