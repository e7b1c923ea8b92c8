package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/transport"
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

// demoTable is one of the demo's printed tables: its column names and,
// per fleet (the row's first cell), its cells by column name.
type demoTable struct {
	columns []string
	rows    map[string]map[string]string
}

var columnGap = regexp.MustCompile(`\s{2,}`)

// parseTable reads the table whose header starts with title from the
// demo's output: the header's cells are separated by two spaces or more,
// a row's by spaces, and the table ends at a blank line.
func parseTable(t *testing.T, out, title string) demoTable {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), title) {
			continue
		}
		tab := demoTable{columns: columnGap.Split(strings.TrimSpace(l), -1), rows: map[string]map[string]string{}}
		for _, row := range lines[i+1:] {
			cells := strings.Fields(row)
			if len(cells) == 0 {
				break
			}
			if len(cells) != len(tab.columns) {
				t.Fatalf("table %q: row %q has %d cells for %d columns %q", title, row, len(cells), len(tab.columns), tab.columns)
			}
			tab.rows[cells[0]] = map[string]string{}
			for j, c := range cells {
				tab.rows[cells[0]][tab.columns[j]] = c
			}
		}
		return tab
	}
	t.Fatalf("no table %q in:\n%s", title, out)
	return demoTable{}
}

// num reads an integer cell.
func (d demoTable) num(t *testing.T, row, col string) int {
	t.Helper()
	v, ok := d.rows[row][col]
	if !ok {
		t.Fatalf("no cell %s/%s in %v", row, col, d.rows)
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("cell %s/%s = %q: %v", row, col, v, err)
	}
	return n
}

// legendKeys returns the column names the demo's legend explains.
func legendKeys(t *testing.T, out string) map[string]bool {
	t.Helper()
	i := strings.Index(out, "\ncolumns:\n")
	if i < 0 {
		t.Fatalf("no legend in:\n%s", out)
	}
	keys := map[string]bool{}
	for _, l := range strings.Split(out[i+len("\ncolumns:\n"):], "\n") {
		if l == "" {
			break
		}
		if strings.HasPrefix(l, "   ") {
			continue // an explanation's second line
		}
		for _, k := range strings.Split(columnGap.Split(strings.TrimSpace(l), 2)[0], ", ") {
			keys[k] = true
		}
	}
	return keys
}

// checkDemoOutput checks what every run of the demo must print: the three
// fleets in each table, every column explained, the workers' counts adding
// up and agreeing with the OTA's, and no 429 for a documented limit from
// a shared fleet.
func checkDemoOutput(t *testing.T, out string) {
	t.Helper()
	ota := parseTable(t, out, "what the OTA counted")
	workers := parseTable(t, out, "what the workers counted")
	perEndpoint := parseTable(t, out, "ok/s per endpoint")
	legend := legendKeys(t, out)
	for _, tab := range []demoTable{ota, workers, perEndpoint} {
		for _, c := range tab.columns[1:] {
			if !legend[c] && !slices.Contains(demoModes, c) { // the header describes the fleets
				t.Errorf("column %q is not explained; the legend explains %v", c, legend)
			}
		}
	}
	for _, mode := range demoModes {
		if !regexp.MustCompile(`(?m)^  ` + mode + ` +\S`).MatchString(out) {
			t.Errorf("fleet %q is not described:\n%s", mode, out)
		}
		requests := workers.num(t, mode, "requests")
		sum := 0
		for _, c := range []string{"ok", "429", "gave up", "backpressure", "cut", "error"} {
			sum += workers.num(t, mode, c)
		}
		if sum != requests {
			t.Errorf("%s: the workers' outcomes add up to %d, requests %d", mode, sum, requests)
		}
		if got, want := workers.num(t, mode, "sent"), ota.num(t, mode, "sent"); got != want {
			t.Errorf("%s: the workers sent %d, the OTA counted %d", mode, got, want)
		}
		if got, want := workers.num(t, mode, "ok"), ota.num(t, mode, "ok"); got != want {
			t.Errorf("%s: the workers saw ok %d, the OTA answered ok %d", mode, got, want)
		}
		if got, want := ota.num(t, mode, "sent"), ota.num(t, mode, "ok")+ota.num(t, mode, "429 documented")+ota.num(t, mode, "429 hidden"); got != want {
			t.Errorf("%s: the OTA counted %d sent, ok + 429s = %d", mode, got, want)
		}
		if _, ok := perEndpoint.rows["reservations"][mode]; !ok {
			t.Errorf("ok/s per endpoint has no %s column: %v", mode, perEndpoint.columns)
		}
	}
	for _, mode := range []string{modeShared, modeAdaptive} {
		if n := ota.num(t, mode, "429 documented"); n != 0 {
			t.Errorf("%s fleet: %d 429s for documented limits, want 0:\n%s", mode, n, out)
		}
	}
	if !strings.Contains(out, "counts agree:") || strings.Contains(out, "counts disagree") {
		t.Errorf("the counts check does not say they agree:\n%s", out)
	}
	checkPriorityOutput(t, out)
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
	checkDemoOutput(t, out)
	ota := parseTable(t, out, "what the OTA counted")
	if ota.num(t, modeNaive, "429 documented")+ota.num(t, modeNaive, "429 hidden") == 0 {
		t.Errorf("naive fleet: no 429s; the comparison shows nothing:\n%s", out)
	}
	if !strings.Contains(out, "verdict: ") || !strings.Contains(out, "shared broke none; adaptive broke none") {
		t.Errorf("verdict missing:\n%s", out)
	}
	// The progress goes to stderr (one line per second, not a terminal).
	for _, mode := range demoModes {
		if !strings.Contains(errOut, "  "+mode+" ok ") {
			t.Errorf("no progress of %s on stderr:\n%s", mode, errOut)
		}
	}
}

func TestDemoFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--duration", "0s"}, "--duration must be above 0 and at most 10m0s, got 0s"},
		{[]string{"--duration", "1h"}, "--duration must be above 0 and at most 10m0s, got 1h0m0s"},
		{[]string{"--workers", "0"}, "--workers must be between 1 and 1000, got 0"},
		{[]string{"--processes", "0"}, "--processes must be between 1 and --workers (6), got 0"},
		{[]string{"--processes", "7"}, "--processes must be between 1 and --workers (6), got 7"},
		{[]string{"--processes", "2"}, "--processes 2 needs --redis"},
		{[]string{"--rate", "0"}, "--rate must be above 0"},
		{[]string{"--rate", "NaN"}, "--rate must be above 0"},
		{[]string{"--share", "1.5"}, "--share must be above 0 and at most 1, got 1.5"},
		{[]string{"--share", "-0.1"}, "--share must be above 0"},
		{[]string{"--redis", "http://127.0.0.1:1"}, `--redis: redis URL http://127.0.0.1:1: scheme must be`},
		// The cause is named (connection refused; on a loaded machine the
		// dial that names it may time out instead), the password is not.
		{[]string{"--redis", "redis://:s3cret@127.0.0.1:1/0"}, `--redis redis://:xxxxx@127.0.0.1:1/0: redis does not answer: no answer in time: dial tcp 127.0.0.1:1: `},
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
		{[]string{"--mode", "both"}, `--mode must be one of naive, shared, adaptive, got "both"`},
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
	if !strings.Contains(out, "of 6 workers (3 processes)") || !strings.Contains(out, "in Redis at "+srv.URL()) {
		t.Errorf("the header does not name the processes and the store:\n%s", out)
	}
	checkDemoOutput(t, out)
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
	res := []modeResult{{
		mode:      modeNaive,
		endpoints: mockota.Demo().Endpoints,
		stats:     map[string]mockota.Stats{"availability": {Requests: 12, Accepted: 10, Documented: 2}},
	}, {
		mode:      modeShared,
		endpoints: mockota.Demo().Endpoints,
		stats: map[string]mockota.Stats{
			"availability": {Requests: 10, Accepted: 10},
			"reservations": {Requests: 5, Accepted: 4, Hidden: 1},
		},
	}}
	if err := sharedVerdict(res); err != nil {
		t.Errorf("naive and hidden 429s only: verdict %v, want none: the naive fleet promises nothing, the hidden limit is not documented", err)
	}
	res = append(res, modeResult{mode: modeAdaptive, endpoints: mockota.Demo().Endpoints,
		stats: map[string]mockota.Stats{"reservations": {Requests: 12, Accepted: 10, Documented: 2}}})
	err := sharedVerdict(res)
	if err == nil || !strings.Contains(err.Error(), "broke a documented limit") || !strings.Contains(err.Error(), "adaptive: reservations 2") {
		t.Errorf("verdict = %v, want an error naming adaptive: reservations 2", err)
	}
}

// TestCountsDisagree checks that the check line names a fleet whose
// workers' counts differ from the OTA's, as they did when the run's
// deadline cut answers the OTA had counted.
func TestCountsDisagree(t *testing.T) {
	t.Parallel()
	res := []modeResult{{
		mode:   modeShared,
		stats:  map[string]mockota.Stats{"availability": {Requests: 66, Accepted: 64, Hidden: 2}},
		report: fleetReport{Outcomes: map[string]int{outcomeOK: 61, outcomeCut: 6}, Sends: 66},
	}}
	var out bytes.Buffer
	printCheck(&out, res)
	if want := "counts disagree: shared: the workers saw ok 61, the OTA answered ok 64"; !strings.Contains(out.String(), want) {
		t.Errorf("check = %q, want it to contain %q", out.String(), want)
	}
	res[0].report.Outcomes[outcomeOK] = 64
	out.Reset()
	printCheck(&out, res)
	if !strings.HasPrefix(out.String(), "counts agree") {
		t.Errorf("check = %q, want counts agree", out.String())
	}
}

// TestSendClockFinishesASentRequest checks the fix for the disagreement:
// a request already sent when the run's deadline passes gets its answer,
// which the OTA has counted, instead of a context error counted as "cut".
func TestSendClockFinishesASentRequest(t *testing.T) {
	t.Parallel()
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	clock := &sendClock{base: srv.Client().Transport}
	ctx, cancel := context.WithCancel(t.Context())
	var sent time.Time
	req, _ := http.NewRequestWithContext(context.WithValue(ctx, sentAtKey{}, &sent), http.MethodGet, srv.URL, nil)
	go func() {
		<-arrived
		cancel() // the run ends while the request is in flight
		close(release)
	}()
	resp, err := (&http.Client{Transport: clock}).Do(req)
	if err != nil {
		t.Fatalf("a sent request failed at the end of the run: %v", err)
	}
	resp.Body.Close()
	if got := classifyOutcome(resp, err, !sent.IsZero()); got != outcomeOK || clock.sends.Load() != 1 {
		t.Errorf("outcome %q, sends %d; want ok, 1", got, clock.sends.Load())
	}
	// A request whose run has ended is not sent.
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err = (&http.Client{Transport: clock}).Do(req)
	if got := classifyOutcome(resp, err, false); got != outcomeCut || clock.sends.Load() != 1 {
		t.Errorf("after the end: outcome %q, sends %d; want cut, still 1", got, clock.sends.Load())
	}
}

func TestClassifyOutcome(t *testing.T) {
	t.Parallel()
	gaveUp := &transport.GaveUpError{Channel: "c", Endpoint: "e", Attempts: 1, StatusCode: 429, Cause: context.DeadlineExceeded}
	lowered := &fleetrate.BackpressureError{RetryAfter: time.Second, MaxWait: 100 * time.Millisecond}
	full := &fleetrate.BackpressureError{RetryAfter: 6 * time.Second, MaxWait: fleetrate.DefaultMaxWait}
	tests := []struct {
		name string
		resp *http.Response
		err  error
		sent bool
		want string
	}{
		{"200", &http.Response{StatusCode: 200}, nil, true, outcomeOK},
		{"429", &http.Response{StatusCode: 429}, nil, true, outcomeLimited},
		{"500", &http.Response{StatusCode: 500}, nil, true, outcomeError},
		{"gave up at the end of the run", nil, gaveUp, true, outcomeGaveUp},
		{"retry not booked", nil, fmt.Errorf("x: %w", full), true, outcomeGaveUp},
		{"deadline before sending", nil, context.DeadlineExceeded, false, outcomeCut},
		{"lowered max wait", nil, fmt.Errorf("x: %w", lowered), false, outcomeCut},
		{"backpressure", nil, fmt.Errorf("x: %w", full), false, outcomeBackpressure},
		{"other", nil, errors.New("boom"), false, outcomeError},
	}
	for _, tc := range tests {
		if got := classifyOutcome(tc.resp, tc.err, tc.sent); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

// slowAnswers delays an answer after the mock OTA has decided and counted
// it, as a loaded machine does.
type slowAnswers struct {
	http.ResponseWriter
	wrote bool
}

func (s *slowAnswers) WriteHeader(code int) {
	if !s.wrote {
		s.wrote = true
		time.Sleep(30 * time.Millisecond)
		s.ResponseWriter.WriteHeader(code)
	}
}

func (s *slowAnswers) Write(p []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return s.ResponseWriter.Write(p)
}

// TestFleetCountsMatchASlowOTA runs each fleet against a mock OTA whose
// answers are late, so that some are still on the way when the run ends:
// the workers must still count every send and every ok the OTA counted.
// (Before the send clock let sent requests finish, such answers were
// counted as "cut" and the workers saw fewer ok than the OTA answered.)
func TestFleetCountsMatchASlowOTA(t *testing.T) {
	t.Parallel()
	for _, mode := range demoModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ota, err := mockota.New(demoOTA())
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ota.ServeHTTP(&slowAnswers{ResponseWriter: w}, r)
			}))
			defer srv.Close()
			start := time.Now().Add(20 * time.Millisecond)
			report, err := runFleet(t.Context(), fleetSpec{Mode: mode, OTA: srv.URL, Workers: 6, Start: start,
				Until: start.Add(time.Second), Share: 0.9, Rate: 10, Prefix: "t:" + mode + ":"})
			if err != nil {
				t.Fatal(err)
			}
			var sent, ok int
			for _, s := range ota.Stats() {
				sent += s.Requests
				ok += s.Accepted
			}
			if report.Sends != sent || report.Outcomes[outcomeOK] != ok {
				t.Errorf("workers: sent %d, ok %d; OTA: sent %d, ok %d (outcomes %v)", report.Sends, report.Outcomes[outcomeOK], sent, ok, report.Outcomes)
			}
		})
	}
}

// TestDemoStoreNameHidesThePassword: the header names the Redis URL
// without its password, as bench and serve do.
func TestDemoStoreNameHidesThePassword(t *testing.T) {
	t.Parallel()
	got := demoOptions{redis: "redis://user:s3cret@127.0.0.1:6379/0"}.storeName()
	if want := "Redis at redis://user:xxxxx@127.0.0.1:6379/0"; got != want {
		t.Errorf("storeName() = %q, want %q", got, want)
	}
}
