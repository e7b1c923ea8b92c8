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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/httplimit"
	"github.com/fleetrate/fleetrate/internal/harness/manualclock"
	"github.com/fleetrate/fleetrate/memstore"
)

func send(t *testing.T, srv *httptest.Server, method, path, key string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func usage(t *testing.T, srv *httptest.Server, key string) httplimit.UsageReport {
	t.Helper()
	resp := send(t, srv, http.MethodGet, "/v1/usage", key)
	var u httplimit.UsageReport
	if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("usage: %s (%v)", resp.Status, err)
	}
	return u
}

// TestPlans runs a free customer in Tokyo through its day: a request every
// 6 s (the per-minute bucket's pace) until the day's 100 are used, then a
// 429 stating the quota and Tokyo's midnight, the usage page saying the
// same, and the quota back at midnight; a customer in Paris and a pro
// customer are unaffected.
func TestPlans(t *testing.T) {
	t.Parallel()
	clock := manualclock.New(time.Date(2026, 3, 2, 14, 0, 0, 0, time.UTC)) // 23:00 in Tokyo
	midnight := time.Date(2026, 3, 2, 15, 0, 0, 0, time.UTC)
	h, err := newServer(memstore.New(memstore.Options{Clock: clock.Now}), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	for i := range 100 {
		if resp := send(t, srv, http.MethodPost, "/v1/messages", "sk_free_tokyo"); resp.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: %s %s", i+1, resp.Status, resp.Header.Get("RateLimit"))
		}
		clock.Advance(6 * time.Second)
	}
	resp := send(t, srv, http.MethodPost, "/v1/messages", "sk_free_tokyo")
	left := midnight.Sub(clock.Now())
	if resp.StatusCode != http.StatusTooManyRequests ||
		resp.Header.Get("RateLimit") != fmt.Sprintf(`"api.free.day";r=0;t=%d`, int(left.Seconds())) ||
		resp.Header.Get("Retry-After") != strconv.Itoa(int(left.Seconds())) ||
		resp.Header.Get("X-RateLimit-Reset") != strconv.FormatInt(midnight.Unix(), 10) {
		t.Errorf("101st request: %s, RateLimit %q, Retry-After %q, X-RateLimit-Reset %q; want 429 until %v",
			resp.Status, resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Reset"), midnight)
	}
	u := usage(t, srv, "sk_free_tokyo")
	if q := u.Quotas[0]; u.Policy != "api.free" || q.Name != "api.free.day" || q.Used != 100 || q.Remaining != 0 || !q.Reset.Equal(midnight) || u.Available != 0 {
		t.Errorf("usage %+v", u)
	}
	if resp := send(t, srv, http.MethodPost, "/v1/messages", "sk_free_paris"); resp.StatusCode != http.StatusCreated {
		t.Errorf("Paris: %s", resp.Status)
	}
	send(t, srv, http.MethodPost, "/v1/messages", "sk_pro_acme")
	if q := usage(t, srv, "sk_pro_acme").Quotas[0]; q.Count != 10_000 || q.Used != 1 || !q.Reset.Equal(time.Date(2026, 4, 1, 4, 0, 0, 0, time.UTC)) {
		t.Errorf("pro usage %+v; want the month to reset at midnight on April 1st in New York", q)
	}
	if resp := send(t, srv, http.MethodPost, "/v1/messages", "sk_nobody"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unknown key: %s", resp.Status)
	}
	clock.Advance(left)
	if resp := send(t, srv, http.MethodPost, "/v1/messages", "sk_free_tokyo"); resp.StatusCode != http.StatusCreated {
		t.Errorf("after Tokyo's midnight: %s", resp.Status)
	}
}

// TestRun starts the command on a free loopback port, sends a request and
// reads the usage, and stops it through its context.
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0"}, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no startup line: %v (%v)", err, <-done)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url := strings.TrimSpace(strings.TrimPrefix(line, "plans: listening on "))
	c := &http.Client{Timeout: 5 * time.Second}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", nil)
	req.Header.Set("X-API-Key", "sk_pro_acme")
	resp, err := c.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST: %v %v", resp, err)
	}
	resp.Body.Close()
	req, _ = http.NewRequest(http.MethodGet, url+"/v1/usage", nil)
	req.Header.Set("X-API-Key", "sk_pro_acme")
	if resp, err = c.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("usage: %v %v", resp, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"used":1`) {
		t.Errorf("usage %s", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
	if err := run(context.Background(), []string{"extra"}, io.Discard, io.Discard); err == nil {
		t.Error("run accepted an argument")
	}
}
