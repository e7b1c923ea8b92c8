package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/mockota"
	"github.com/fleetrate/fleetrate/internal/redistest"
)

// When "demo --processes" re-executes this test binary as a worker
// process, run the command instead of the tests. This runs before the
// testing package parses its flags.
func init() {
	if os.Getenv(demoChildEnv) == "1" {
		if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
			os.Stderr.WriteString("fleetrate: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// section returns the lines of the demo's output for one run.
func section(out, mode string) string {
	i := strings.Index(out, "\n"+mode+": ")
	if i < 0 {
		return ""
	}
	rest := out[i+1:]
	if j := strings.Index(rest, "\n\n"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

var documented429 = regexp.MustCompile(`(?m)^\s+credential\s+30/s\s+\d+\s+\d+\s+(\d+)\s`)

// credential429s reads the credential row's "429 documented" column.
func credential429s(t *testing.T, sec string) int {
	t.Helper()
	m := documented429.FindStringSubmatch(sec)
	if m == nil {
		t.Fatalf("no credential row in:\n%s", sec)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func runDemoForTest(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	err := run(ctx, append([]string{"demo"}, args...), os.Getenv, &out, &errb)
	return out.String(), errb.String(), err
}

func TestDemoRuns(t *testing.T) {
	out, errOut, err := runDemoForTest(t, "--duration", "1500ms")
	if err != nil {
		t.Fatalf("demo failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	naive, shared := section(out, modeNaive), section(out, modeShared)
	if naive == "" || shared == "" {
		t.Fatalf("missing a run's table:\n%s", out)
	}
	for _, want := range []string{"availability", "rates", "reservations", "credential", "p50", "p99", "ok/s of limit"} {
		if !strings.Contains(shared, want) || !strings.Contains(naive, want) {
			t.Errorf("a table lacks %q:\n%s", want, out)
		}
	}
	if n := credential429s(t, naive); n == 0 {
		t.Errorf("naive run: no 429s for documented limits; the comparison shows nothing:\n%s", naive)
	}
	if n := credential429s(t, shared); n != 0 {
		t.Errorf("shared run: %d 429s for documented limits, want 0:\n%s", n, shared)
	}
	if !strings.Contains(shared, "verdict: no documented limit broken") {
		t.Errorf("shared verdict missing:\n%s", shared)
	}
	// The progress goes to stderr (one line per second, not a terminal).
	if !strings.Contains(errOut, "naive ") || !strings.Contains(errOut, "shared ") {
		t.Errorf("no progress on stderr:\n%s", errOut)
	}
}

func TestDemoFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "0s"}, "--duration must be between 0 and 10m0s, got 0s"},
		{[]string{"--duration", "1h"}, "--duration must be between"},
		{[]string{"--workers", "0"}, "--workers must be between 1 and 1000, got 0"},
		{[]string{"--processes", "0"}, "--processes must be between 1 and --workers (6), got 0"},
		{[]string{"--processes", "7"}, "--processes must be between 1 and --workers (6), got 7"},
		{[]string{"--processes", "2"}, "--processes 2 needs --redis"},
		{[]string{"--rate", "0"}, "--rate must be above 0"},
		{[]string{"--rate", "NaN"}, "--rate must be above 0"},
		{[]string{"--share", "1.5"}, "--share must be above 0 and at most 1, got 1.5"},
		{[]string{"--share", "-0.1"}, "--share must be above 0"},
		{[]string{"--redis", "http://127.0.0.1:1"}, `--redis "http://127.0.0.1:1"`},
		{[]string{"extra"}, `unknown command "extra"`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			out, _, err := runDemoForTest(t, append(tc.args, "--progress=false")...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q\n%s", err, tc.want, out)
			}
		})
	}
}

func TestDemoWorkerFlagErrors(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC()
	ok := []string{"--mode", "shared", "--ota", "http://127.0.0.1:1", "--workers", "1", "--share", "0.9",
		"--start", now.Format(time.RFC3339Nano), "--until", now.Add(time.Second).Format(time.RFC3339Nano)}
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--mode", "both"}, `--mode must be "naive" or "shared", got "both"`},
		{[]string{"--workers", "0"}, "--workers must be between 1 and 1000, got 0"},
		{[]string{"--start", "yesterday"}, "--start"},
		{[]string{"--until", now.Format(time.RFC3339Nano)}, "--until must be after --start"},
		{[]string{"--share", "2"}, "--share must be above 0 and at most 1, got 2"},
		{[]string{"--mode", "naive", "--rate", "0"}, "--rate must be above 0"},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		// Later flags win, so each case overrides one valid flag.
		err := run(t.Context(), append(append([]string{"demo", "worker"}, ok...), tc.args...), os.Getenv, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}

func TestDemoOverRedisInProcesses(t *testing.T) {
	srv := redistest.Start(t)
	out, errOut, err := runDemoForTest(t, "--duration", "1500ms", "--redis", srv.URL(), "--processes", "3")
	if err != nil {
		t.Fatalf("demo failed: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	if !strings.Contains(out, "6 workers (3 processes)") || !strings.Contains(out, "in Redis at "+srv.URL()) {
		t.Errorf("the header does not name the processes and the store:\n%s", out)
	}
	shared := section(out, modeShared)
	if n := credential429s(t, shared); n != 0 {
		t.Errorf("shared run over Redis: %d 429s for documented limits, want 0:\n%s", n, shared)
	}
	if credential429s(t, section(out, modeNaive)) == 0 {
		t.Errorf("naive run: no documented 429s:\n%s", out)
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	ds := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, tc := range []struct {
		p    int
		want time.Duration
	}{{50, 5}, {99, 10}, {100, 10}, {1, 1}, {0, 1}} {
		if got := percentile(ds, tc.p); got != tc.want {
			t.Errorf("percentile(p%d) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 50); got != 0 {
		t.Errorf("percentile(empty) = %v, want 0", got)
	}
}

func TestSharedVerdict(t *testing.T) {
	t.Parallel()
	res := modeResult{
		endpoints: mockota.Demo().Endpoints,
		stats: map[string]mockota.Stats{
			"availability": {Requests: 10, Accepted: 10},
			"rates":        {Requests: 5, Accepted: 4, Hidden: 1},
		},
	}
	if err := sharedVerdict(res); err != nil {
		t.Errorf("hidden 429s only: verdict %v, want none: the hidden limit is not documented", err)
	}
	res.stats["reservations"] = mockota.Stats{Requests: 12, Accepted: 10, Documented: 2}
	err := sharedVerdict(res)
	if err == nil || !strings.Contains(err.Error(), "broke a documented limit") || !strings.Contains(err.Error(), "reservations 2") {
		t.Errorf("verdict = %v, want an error naming reservations 2", err)
	}
}
