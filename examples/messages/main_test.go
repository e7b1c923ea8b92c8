package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate/httplimit"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/headers"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

func newMemServer(t *testing.T) (*httptest.Server, *manualclock.Clock) {
	t.Helper()
	c := manualclock.New(time.Date(2026, 3, 2, 12, 0, 0, 0, time.UTC))
	h, err := newServer(serverConfig{
		Store:  memstore.New(memstore.Options{Clock: c.Now}),
		Rate:   10,
		Burst:  20,
		Logger: slog.New(slog.DiscardHandler),
		Now:    c.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, c
}

func post(t *testing.T, c *http.Client, url, key, contentType, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func get(t *testing.T, c *http.Client, url, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func decode[T any](t *testing.T, resp *http.Response) T {
	t.Helper()
	var v T
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("decoding %s body: %v", resp.Status, err)
	}
	return v
}

func TestMessagesAPI(t *testing.T) {
	t.Parallel()
	srv, _ := newMemServer(t)
	c := srv.Client()

	resp := post(t, c, srv.URL, "sk_alice", "application/json", `{"to":"bob","body":"hello"}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %s", resp.Status)
	}
	msg := decode[message](t, resp)
	if msg.To != "bob" || msg.Body != "hello" || !strings.HasPrefix(msg.ID, "msg_") || msg.CreatedAt.IsZero() {
		t.Errorf("created %+v", msg)
	}
	if loc := resp.Header.Get("Location"); loc != "/v1/messages/"+msg.ID {
		t.Errorf("Location = %q", loc)
	}
	if resp.Header.Get(httplimit.HeaderRateLimit) == "" || resp.Header.Get(httplimit.HeaderRateLimitPolicy) == "" {
		t.Errorf("a created response lacks RateLimit headers: %v", resp.Header)
	}

	resp = get(t, c, srv.URL+"/v1/messages/"+msg.ID, "sk_alice")
	if got := decode[message](t, resp); resp.StatusCode != http.StatusOK || got.ID != msg.ID {
		t.Errorf("get own message: %s %+v", resp.Status, got)
	}
	if resp := get(t, c, srv.URL+"/v1/messages/"+msg.ID, "sk_mallory"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("another key read the message: %s", resp.Status)
	}
	resp = get(t, c, srv.URL+"/v1/messages", "sk_alice")
	list := decode[struct{ Messages []message }](t, resp)
	if len(list.Messages) != 1 || list.Messages[0].ID != msg.ID {
		t.Errorf("list = %+v", list)
	}
	if resp := get(t, c, srv.URL+"/healthz", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %s", resp.Status)
	}
}

func TestMessagesValidation(t *testing.T) {
	t.Parallel()
	srv, _ := newMemServer(t)
	c := srv.Client()
	tests := []struct {
		name        string
		key, ct     string
		body        string
		status      int
		wantInError string
	}{
		{"no key", "", "application/json", `{"to":"a","body":"b"}`, 401, "X-API-Key"},
		{"key too long", strings.Repeat("k", 600), "application/json", `{"to":"a","body":"b"}`, 401, "at most"},
		{"not JSON content type", "k", "text/plain", `{"to":"a","body":"b"}`, 415, "application/json"},
		{"broken JSON", "k", "application/json", `{"to":`, 400, "not a valid"},
		{"unknown field", "k", "application/json", `{"to":"a","body":"b","cc":"c"}`, 400, "cc"},
		{"two objects", "k", "application/json", `{"to":"a","body":"b"}{}`, 400, "exactly one"},
		{"missing fields", "k", "application/json", `{}`, 422, `"field":"to"`},
		{"blank body", "k", "application/json", `{"to":"a","body":"  "}`, 422, `"field":"body"`},
		{"body too long", "k", "application/json", `{"to":"a","body":"` + strings.Repeat("é", maxBodyRunes+1) + `"}`, 422, "at most"},
		{"request too large", "k", "application/json", `{"to":"a","body":"` + strings.Repeat("x", maxBodyBytes) + `"}`, 413, "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, c, srv.URL, tt.key, tt.ct, tt.body)
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %s, want %d: %s", resp.Status, tt.status, body)
			}
			if ct := resp.Header.Get("Content-Type"); ct != httplimit.ProblemContentType {
				t.Errorf("Content-Type = %q", ct)
			}
			if !strings.Contains(string(body), tt.wantInError) {
				t.Errorf("body %s does not mention %q", body, tt.wantInError)
			}
		})
	}
}

// TestPostIsRateLimitedPerKey drives one key past 10/s burst 20 on the
// injected clock: the 21st POST is refused with the standard headers
// while reads and other keys carry on, and obeying Retry-After works.
func TestPostIsRateLimitedPerKey(t *testing.T) {
	t.Parallel()
	srv, clk := newMemServer(t)
	c := srv.Client()
	const body = `{"to":"bob","body":"hi"}`
	for i := range 20 {
		if resp := post(t, c, srv.URL, "sk_busy", "application/json", body); resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %d: %s", i, resp.Status)
		}
	}
	resp := post(t, c, srv.URL, "sk_busy", "application/json", body)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("POST 21: %s, want 429", resp.Status)
	}
	if _, err := headers.ParseRateLimit(resp.Header.Values("RateLimit")...); err != nil {
		t.Errorf("RateLimit: %v", err)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"messages";q=20;w=2` {
		t.Errorf("RateLimit-Policy = %s", got)
	}
	p := decode[httplimit.Problem](t, resp)
	if p.Status != 429 || p.ViolatedPolicies[0] != "messages" {
		t.Errorf("problem %+v", p)
	}
	if resp := get(t, c, srv.URL+"/v1/messages", "sk_busy"); resp.StatusCode != http.StatusOK {
		t.Errorf("reads limited with writes: %s", resp.Status)
	}
	if resp := post(t, c, srv.URL, "sk_other", "application/json", body); resp.StatusCode != http.StatusCreated {
		t.Errorf("another key limited: %s", resp.Status)
	}
	ra, ok := transport.ParseRetryAfter(resp.Header.Get("Retry-After"), clk.Now(), 400*24*time.Hour)
	if !ok {
		t.Fatalf("Retry-After %q does not parse", resp.Header.Get("Retry-After"))
	}
	clk.Advance(ra)
	if resp := post(t, c, srv.URL, "sk_busy", "application/json", body); resp.StatusCode != http.StatusCreated {
		t.Errorf("after Retry-After %v: %s", ra, resp.Status)
	}
}

// TestTwoInstancesShareOneRedisBudget runs two instances of the service,
// each with its own Redis client, over one real Redis. Clients hammer
// both for a bounded time; per API key, the total admitted across both
// must stay within burst + rate × elapsed, one budget and not two.
func TestTwoInstancesShareOneRedisBudget(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	// A rate low enough that the workers outrun it however slowly a
	// loaded machine runs them, and a timeout no loaded machine reaches:
	// every answer is then a decision (201 or 429), never a timeout.
	const rate, burst = 1, 20
	const timeout = 10 * time.Second
	var servers []*httptest.Server
	for range 2 {
		client := redis.NewClient(&redis.Options{Addr: rs.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = client.Close() })
		store, err := redisstore.New(client, redisstore.Options{Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		h, err := newServer(serverConfig{Store: store, Rate: rate, Burst: burst, FailClosed: true, Timeout: timeout, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}

	keys := []string{"sk_live_{tenant}:a", "sk_live_{tenant}:b"}
	type counts struct{ admitted, refused, other [2]atomic.Int64 }
	perKey := make([]counts, len(keys))
	const (
		workers     = 4
		maxRequests = 40 // per worker: 80 per key, far past burst + rate × T
		maxDuration = 30 * time.Second
	)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range maxRequests {
				if time.Since(start) > maxDuration {
					return
				}
				k := (w + i) % len(keys)
				inst := i % 2
				req, _ := http.NewRequest(http.MethodPost, servers[inst].URL+"/v1/messages", strings.NewReader(`{"to":"bob","body":"hi"}`))
				req.Header.Set("X-API-Key", keys[k])
				req.Header.Set("Content-Type", "application/json")
				resp, err := servers[inst].Client().Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusCreated:
					perKey[k].admitted[inst].Add(1)
				case http.StatusTooManyRequests:
					perKey[k].refused[inst].Add(1)
				default:
					perKey[k].other[inst].Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	bound := burst + rate*elapsed.Seconds()
	for k := range perKey {
		c := &perKey[k]
		a0, a1 := c.admitted[0].Load(), c.admitted[1].Load()
		total := a0 + a1
		t.Logf("key %d: admitted %d+%d=%d, refused %d+%d in %v (bound %.1f)", k, a0, a1, total,
			c.refused[0].Load(), c.refused[1].Load(), elapsed, bound)
		if float64(total) > bound {
			t.Errorf("key %q: %d admitted across two instances in %v, more than burst + rate × T = %.1f", keys[k], total, elapsed, bound)
		}
		if total < burst {
			t.Errorf("key %q: only %d admitted, want at least the burst of %d", keys[k], total, burst)
		}
		if a0 == 0 || a1 == 0 {
			t.Errorf("key %q: an instance admitted nothing (%d, %d)", keys[k], a0, a1)
		}
		if c.refused[0].Load()+c.refused[1].Load() == 0 {
			t.Errorf("key %q: nothing refused; the test did not push past the limit", keys[k])
		}
		if o := c.other[0].Load() + c.other[1].Load(); o > 0 {
			t.Errorf("key %q: %d responses neither 201 nor 429", keys[k], o)
		}
	}
}

// TestRun starts the command on a free loopback port against a real
// Redis, sends one request, and stops it through its context.
func TestRun(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		// A rate so low that the second request is denied however late it
		// comes, and a timeout no loaded machine reaches.
		args := []string{"-addr", "127.0.0.1:0", "-redis", rs.URL(), "-rate", "0.01", "-burst", "1", "-timeout", "10s"}
		done <- run(ctx, args, func(string) string { return "" }, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no startup line: %v (%v)", err, <-done)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	var url string
	if _, err := fmt.Sscanf(line, "messages: listening on %s", &url); err != nil || !strings.Contains(line, "Redis at") {
		t.Fatalf("startup line %q", line)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	for i, want := range []int{201, 429} {
		if resp := post(t, c, url, "k", "application/json", `{"to":"a","body":"b"}`); resp.StatusCode != want {
			t.Errorf("request %d: %s, want %d", i, resp.Status, want)
		}
	}
	if resp := get(t, c, url+"/metrics", ""); resp.StatusCode != http.StatusOK {
		t.Errorf("metrics: %s", resp.Status)
	} else if b, _ := io.ReadAll(resp.Body); !strings.Contains(string(b), `fleetrate_http_requests_total{outcome="denied",policy="messages"} 1`) {
		t.Errorf("metrics lack the denial")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	env := func(string) string { return "" }
	for _, args := range [][]string{
		{"-rate", "0"},
		{"-burst", "-1"},
		{"-timeout", "-1s"},
		{"-redis", "mysql://nope"},
		{"-bogus"},
		{"extra"},
		{"-addr", "256.0.0.1:1"},
	} {
		err := run(context.Background(), args, env, io.Discard, io.Discard)
		if err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// TestHelpExitsZero: -h prints every flag, with the ones the README lists,
// and the process exits 0; a bad flag exits 2 and an error 1.
func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	var stderr strings.Builder
	err := run(context.Background(), []string{"-h"}, func(string) string { return "" }, io.Discard, &stderr)
	if code := exitCode(err, io.Discard); code != 0 {
		t.Errorf("-h: exit %d (%v), want 0", code, err)
	}
	for _, flag := range []string{"-addr", "-redis", "-rate", "-burst", "-fail-closed", "-shadow", "-legacy-headers", "127.0.0.1:8090"} {
		if !strings.Contains(stderr.String(), flag) {
			t.Errorf("usage does not mention %s:\n%s", flag, stderr.String())
		}
	}
	err = run(context.Background(), []string{"-no-such-flag"}, func(string) string { return "" }, io.Discard, io.Discard)
	if code := exitCode(err, io.Discard); code != 2 {
		t.Errorf("unknown flag: exit %d (%v), want 2", code, err)
	}
	var out strings.Builder
	if code := exitCode(fmt.Errorf("boom"), &out); code != 1 || out.String() != "messages: boom\n" {
		t.Errorf("error: exit %d, printed %q", code, out.String())
	}
}
