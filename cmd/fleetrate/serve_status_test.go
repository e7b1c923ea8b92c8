package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/harness/tool"
)

const statusTestConfig = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
buckets:
  - channel: booking_com
    endpoint: availability
    rate_limit: {unit: minute, requests_per_unit: 1, burst: 5}
  - channel: booking_com
    endpoint: rates
    rate_limit: {unit: second, requests_per_unit: 5}
`

// chromium returns the path of a headless-capable Chromium, or fails or
// skips the test (package tool) saying how to install one.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FLEETRATE_CHROMIUM"); p != "" {
		return p
	}
	return tool.Find(t, "the status page's browser tests; or set FLEETRATE_CHROMIUM",
		"chromium", "chromium-browser", "google-chrome")
}

// runChromium loads url headless, lets its scripts run for budget of
// virtual time, and returns the DOM (or writes a screenshot when shot is
// set).
func runChromium(t *testing.T, bin, url, shot string, budget time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--hide-scrollbars",
		fmt.Sprintf("--virtual-time-budget=%d", budget.Milliseconds()),
	}
	if shot != "" {
		args = append(args, "--window-size=1100,900", "--screenshot="+shot)
	} else {
		args = append(args, "--dump-dom")
	}
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return string(out)
}

// domRow returns the data-field cells of the table row whose attr is
// value, as Chromium serialises them.
func domRow(t *testing.T, dom, attr, value string) map[string]string {
	t.Helper()
	start := strings.Index(dom, fmt.Sprintf(`<tr data-%s="%s">`, attr, value))
	if start < 0 {
		t.Fatalf("no row with data-%s=%q in the page:\n%s", attr, value, dom)
	}
	row := dom[start:]
	row = row[:strings.Index(row, "</tr>")]
	cells := map[string]string{}
	for _, m := range regexp.MustCompile(`<td[^>]*data-field="([a-z_]+)"[^>]*>(.*?)</td>`).FindAllStringSubmatch(row, -1) {
		cells[m[1]] = m[2]
	}
	return cells
}

func domText(t *testing.T, dom, id string) string {
	t.Helper()
	m := regexp.MustCompile(`id="` + id + `"[^>]*>([^<]*)<`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no element #%s in the page:\n%s", id, dom)
	}
	return m[1]
}

// serviceDecisions sums fleetrate_decisions_total from the service's own
// /metrics by result.
func serviceDecisions(t *testing.T, base string) map[string]int {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]int{}
	re := regexp.MustCompile(`^fleetrate_decisions_total\{.*result="([a-z_]+)".*\} (\d+)$`)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := re.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(m[2])
			out[m[1]] += n
		}
	}
	return out
}

// TestStatusPageInABrowser drives traffic through the service, loads the
// status page in headless Chromium, and checks that what it renders
// matches the service's own decisions.
func TestStatusPageInABrowser(t *testing.T) {
	bin := chromium(t)
	path := serveWriteFile(t, "fleetrate.yaml", statusTestConfig)
	tokens := serveWriteFile(t, "tokens", "ops-token all\n")
	httpAddr, _, _, _ := startServe(t, "--config", path, "--reload-interval", "0", "--auth-token-file", tokens)
	base := "http://" + httpAddr
	client := &http.Client{Transport: bearer{"ops-token"}}

	// 8 takes from a bucket of 5 that refills one a minute: 5 granted, 3
	// denied. 4 requests from one address allowed 2 a minute: 2 denied.
	granted, denied := 0, 0
	for range 8 {
		code, m := servePost(t, client, base+"/v1/take", `{"bucket":"booking_com/availability"}`)
		if code != 200 {
			t.Fatalf("/v1/take: %d %v", code, m)
		}
		if m["allowed"] == true {
			granted++
		} else {
			denied++
		}
	}
	for range 4 {
		code, _ := servePost(t, client, base+"/json", `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"203.0.113.9"}]}]}`)
		switch code {
		case 200:
			granted++
		case 429:
			denied++
		default:
			t.Fatalf("/json: %d", code)
		}
	}
	if granted != 7 || denied != 5 {
		t.Fatalf("granted %d, denied %d; want 7 and 5", granted, denied)
	}
	svc := serviceDecisions(t, base)
	if svc["allowed"] != granted || svc["over_limit"] != denied {
		t.Fatalf("the service's metrics count %v, the client saw %d granted and %d denied", svc, granted, denied)
	}

	// The browser sends the token as the Basic password, as a person
	// answering the login prompt does.
	dom := runChromium(t, bin, "http://ops:ops-token@"+httpAddr+"/status/", "", 5*time.Second)
	if got := domText(t, dom, "state"); got != "live" {
		t.Fatalf("page state %q, want live", got)
	}
	if got, want := domText(t, dom, "t-decisions"), strconv.Itoa(svc["allowed"]+svc["over_limit"]); got != want {
		t.Errorf("page shows %s decisions, the service made %s", got, want)
	}
	if got, want := domText(t, dom, "t-denied"), strconv.Itoa(svc["over_limit"]); got != want {
		t.Errorf("page shows %s denied, the service denied %s", got, want)
	}
	av := domRow(t, dom, "bucket", "booking_com/availability")
	if av["decisions"] != "8" || av["denied"] != "3" || av["remaining"] != "0 / 5" {
		t.Errorf("availability row = %v, want 8 decisions, 3 denied, 0 / 5 tokens", av)
	}
	if rt := domRow(t, dom, "bucket", "booking_com/rates"); rt["decisions"] != "0" || rt["remaining"] != "5 / 5" {
		t.Errorf("rates row = %v, want untouched and full", rt)
	}
	if strings.Contains(dom, "203.0.113.9") {
		t.Error("the page shows a raw key")
	}
	keys := regexp.MustCompile(`<tr data-key="(h:[0-9a-f]{12})">`).FindAllStringSubmatch(dom, -1)
	if len(keys) != 2 {
		t.Errorf("top denied keys = %v, want the bucket and the address", keys)
	}

	if shot := os.Getenv("FLEETRATE_STATUS_SCREENSHOT"); shot != "" {
		runChromium(t, bin, "http://ops:ops-token@"+httpAddr+"/status/", shot, 5*time.Second)
		t.Logf("screenshot written to %s", shot)
	}

	// A browser with no token gets the login prompt, not the page.
	resp, err := http.Get(base + "/status/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
		t.Errorf("no token: %d %q, want 401 with a Basic challenge", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
	}
}

// bearer adds a bearer token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}
