// The Python side of a mixed fleet: `fleetrate serve` on the benchmark's
// Redis, with the scenario's upstream in its upstreams section, and
// Python worker processes (clients/python/bench_worker.py) that book and
// report every call through its outbound API, beside the Go workers.

package outbound

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/benchmarks/internal/benchsvc"
	"github.com/fleetrate/fleetrate/internal/harness/tool"
)

// PythonOutcomes is what a fleet's Python workers saw.
type PythonOutcomes struct {
	// Calls are the calls that got an answer, OK those answered 2xx.
	Calls, OK int
	// GaveUp and Backpressure count the client's GaveUp and Backpressure
	// errors.
	GaveUp, Backpressure int
	// OverheadMS is the service's cost per call, as a Python worker sees
	// it: the time in book and report less the waits for the call's turn
	// the service reports, mean over the calls, in milliseconds.
	OverheadMS float64
	Errors     []string
}

// pythonLine is the line clients/python/bench_worker.py prints.
type pythonLine struct {
	OK           int            `json:"ok"`
	Status       map[string]int `json:"status"`
	GaveUp       int            `json:"gave_up"`
	Backpressure int            `json:"backpressure"`
	Errors       []string       `json:"errors"`
	Calls        int            `json:"calls"`
	OverheadMS   float64        `json:"service_overhead_ms_per_call"`
}

// python returns the Python interpreter with httpx (Debian's, preferred
// over one on PATH) and the repository's clients/python directory.
func python(t testing.TB) (interp, pkg string) {
	t.Helper()
	interp = "/usr/bin/python3"
	if _, err := os.Stat(interp); err != nil {
		interp = tool.Find(t, "the Python workers of the mixed fleet", "python3")
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/fleetrate/fleetrate").Output()
	if err != nil {
		t.Fatalf("finding the fleetrate module: %v", err)
	}
	pkg = filepath.Join(strings.TrimSpace(string(root)), "clients", "python")
	if out, err := exec.Command(interp, "-c", "import httpx").CombinedOutput(); err != nil {
		t.Fatalf("the Python workers need httpx (apt-get install python3-httpx): %v: %s", err, out)
	}
	return interp, pkg
}

// serviceConfig is the upstreams section of s, as its Go workers'
// transport.Upstream (upstreamOf) says it.
func serviceConfig(s Scenario) string {
	limit := func(indent string, rate float64, burst int64) string {
		return fmt.Sprintf("%srate_limit: {unit: second, requests_per_unit: %g, burst: %d}\n", indent, rate, burst)
	}
	var b strings.Builder
	b.WriteString("upstreams:\n  - channel: ota\n")
	fmt.Fprintf(&b, "    fixed: %t\n", s.Fixed)
	if s.HeaderWindow > 0 {
		fmt.Fprintf(&b, "    headers: {window: %v}\n", s.HeaderWindow)
	}
	if s.Credential.Rate > 0 {
		b.WriteString("    credential:\n" + limit("      ", s.Credential.Rate, s.Credential.Burst))
	}
	b.WriteString("    endpoints:\n      - name: avail\n        pattern: /avail\n")
	b.WriteString(limit("        ", s.Limit.Rate, s.Limit.Burst))
	if s.Spacing > 0 {
		fmt.Fprintf(&b, "        spacing: %v\n", s.Spacing)
	}
	return b.String()
}

// startService runs `fleetrate serve` for s over the Redis at addr with
// prefix, and returns its URL; it stops with the test.
func startService(t testing.TB, addr, prefix string, s Scenario) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "fleetrate")
	if err := benchsvc.BuildFleetrate(bin); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "fleetrate.yaml")
	if err := os.WriteFile(cfg, []byte(serviceConfig(s)), 0o600); err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", benchsvc.FreePort())
	var stderr bytes.Buffer
	// The store timeout is the Go workers' (2 s): the default, 15 ms, is
	// for Envoy's RLS calls on a healthy host, not a loaded benchmark.
	cmd := exec.Command(bin, "serve", "--config", cfg, "--redis", "redis://"+addr, "--prefix", prefix,
		"--http-addr", strings.TrimPrefix(url, "http://"), "--grpc-addr", "off", "--log-level", "warn",
		"--store-timeout", "2s", "--max-in-flight", "1024")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("fleetrate serve's log:\n%s", stderr.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		resp, err := http.Get(url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("fleetrate serve did not become ready: %v\n%s", err, stderr.String())
		case <-time.After(50 * time.Millisecond): // polling for readiness
		}
	}
}

// runPython runs n Python worker processes of goroutines tasks each
// against the upstream at upURL through the service at svc, from start
// for d, and returns what they saw once they are done.
func runPython(t testing.TB, n, goroutines int, svc, upURL string, start time.Time, d time.Duration) <-chan PythonOutcomes {
	interp, pkg := python(t)
	done := make(chan PythonOutcomes, 1)
	var (
		mu  sync.Mutex
		out PythonOutcomes
		wg  sync.WaitGroup
	)
	overhead := 0.0
	for range n {
		wg.Go(func() {
			cmd := exec.Command(interp, filepath.Join(pkg, "bench_worker.py"), "--service", svc, "--upstream", upURL,
				"--channel", "ota", "--path", "/avail", "--concurrency", strconv.Itoa(goroutines),
				"--duration", strconv.FormatFloat(d.Seconds(), 'f', 3, 64),
				"--start-at", strconv.FormatFloat(float64(start.UnixNano())/1e9, 'f', 6, 64))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var line pythonLine
			if err == nil {
				err = json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &line)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out.Errors = append(out.Errors, fmt.Sprintf("python worker: %v: %s", err, tail(stderr.String())))
				return
			}
			out.Calls += line.Calls
			out.OK += line.OK
			out.GaveUp += line.GaveUp
			out.Backpressure += line.Backpressure
			out.Errors = append(out.Errors, line.Errors...)
			overhead += line.OverheadMS * float64(line.Calls)
		})
	}
	go func() {
		wg.Wait()
		if out.Calls > 0 {
			out.OverheadMS = overhead / float64(out.Calls)
		}
		done <- out
	}()
	return done
}

// tail is the end of a process's output, for an error.
func tail(s string) string {
	if len(s) > 2000 {
		return "…" + s[len(s)-2000:]
	}
	return s
}
