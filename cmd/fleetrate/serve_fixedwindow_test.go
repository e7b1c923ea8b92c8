package main

import (
	"math"
	"net/http"
	"testing"
	"time"
)

// TestServeFixedWindow: the server section's fixed_window (and the flag)
// reach the server: an envoyproxy/ratelimit limit of 1 per hour refuses
// its second request until the next UTC hour, not for the hour a token
// bucket would wait. The bounds are exact: the server's clock reads the
// time to the hour between the two readings taken around the request,
// and the status rounds it up to whole seconds.
func TestServeFixedWindow(t *testing.T) {
	t.Parallel()
	const src = "server: {fixed_window: true}\n---\ndomain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
	path := serveWriteFile(t, "fleetrate.yaml", src)
	cmd := serveCommand(func(string) string { return "" })
	if err := cmd.ParseFlags([]string{"--config", path}); err != nil {
		t.Fatal(err)
	}
	st, err := resolveSettings(cmd.Flags(), func(string) string { return "" })
	if err != nil || !st.fixedWindow {
		t.Fatalf("fixed_window in the file: settings %v, %v", st.fixedWindow, err)
	}

	httpAddr, _, _, _ := startServe(t, "--config", path, "--reload-interval", "0")
	url := "http://" + httpAddr + "/json"
	body := `{"domain":"edge","descriptors":[{"entries":[{"key":"api_key","value":"k1"}]}]}`
	untilHour := func() time.Duration {
		now := time.Now().UTC()
		return now.Truncate(time.Hour).Add(time.Hour).Sub(now)
	}
	first := untilHour()
	if code, m := servePost(t, http.DefaultClient, url, body); code != 200 {
		t.Fatalf("first request: %d %v", code, m)
	}
	before := untilHour()
	code, m := servePost(t, http.DefaultClient, url, body)
	after := untilHour()
	if after > first {
		t.Skip("the UTC hour turned between the requests")
	}
	if code != http.StatusTooManyRequests {
		t.Fatalf("second request: %d %v, want 429", code, m)
	}
	statuses, _ := m["statuses"].([]any)
	st0, _ := statuses[0].(map[string]any)
	reset, err := time.ParseDuration(st0["durationUntilReset"].(string))
	if err != nil {
		t.Fatalf("durationUntilReset %v: %v", st0["durationUntilReset"], err)
	}
	lo, hi := time.Duration(math.Ceil(after.Seconds()))*time.Second, time.Duration(math.Ceil(before.Seconds()))*time.Second
	if reset < lo || reset > hi {
		t.Fatalf("durationUntilReset %v, want the time to the next UTC hour, between %v and %v", reset, lo, hi)
	}
}
