package main

import (
	"os"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/procs"
)

// TestMain turns the processor governor off for the services the tests
// run inside this process: there is one GOMAXPROCS per process, and the
// tests around them would share it. TestServeAdaptiveProcs runs one in a
// process of its own.
func TestMain(m *testing.M) {
	os.Setenv(envName("adaptive-procs"), "false")
	os.Exit(m.Run())
}

var gomaxprocsMetric = regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`)

// gomaxprocsOf reads the service's GOMAXPROCS from its metrics.
func gomaxprocsOf(t *testing.T, addr string) int {
	t.Helper()
	m := gomaxprocsMetric.FindStringSubmatch(metricsOf(t, addr))
	if m == nil {
		t.Fatal("no go_sched_gomaxprocs_threads in the metrics")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestServeAdaptiveProcs runs `fleetrate serve` as its own process, with
// the processor governor on (the default; the flag overrides TestMain's
// environment): idle, it runs on one processor, and its metrics say so.
// The return to Go's default under load is TestGovernFollowsTheLoad's
// (internal/procs), on a synthetic clock: a real process cannot be
// promised most of a CPU on a shared test machine.
func TestServeAdaptiveProcs(t *testing.T) {
	t.Parallel()
	child := startServeChild(t, nil, "--adaptive-procs", "--log-level", "debug")
	full := runtime.GOMAXPROCS(0) // the child's default too: same machine, same environment
	if full == 1 {
		child.waitLine("processors: one CPU, not adaptive")
		return
	}
	start := child.waitLine("processors: adaptive")
	if want := strconv.Itoa(full) + " from 85 % of one"; start["busy"] != want {
		t.Errorf("startup line says busy %q, want %q", start["busy"], want)
	}
	addr := child.waitLine("fleetrate serving")["http"].(string)
	change := child.waitLine("processors")
	if change["from"] != float64(full) || change["to"] != float64(1) {
		t.Fatalf("first change %v, want from %d to 1", change, full)
	}
	deadline := time.Now().Add(10 * time.Second)
	for gomaxprocsOf(t, addr) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("go_sched_gomaxprocs_threads %d after its change to 1", gomaxprocsOf(t, addr))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeAdaptiveProcsLeavesGOMAXPROCS: a GOMAXPROCS variable is the
// operator's choice, which the governor leaves, and says so.
func TestServeAdaptiveProcsLeavesGOMAXPROCS(t *testing.T) {
	t.Parallel()
	child := startServeChild(t, []string{"GOMAXPROCS=3"}, "--adaptive-procs")
	line := child.waitLine("processors: GOMAXPROCS from the environment, not adaptive")
	if line["gomaxprocs"] != float64(3) {
		t.Errorf("startup line says gomaxprocs %v, want 3", line["gomaxprocs"])
	}
	addr := child.waitLine("fleetrate serving")["http"].(string)
	time.Sleep(2 * procs.DefaultInterval * procs.DefaultSettle) // idle past the governor's settling
	if n := gomaxprocsOf(t, addr); n != 3 {
		t.Errorf("go_sched_gomaxprocs_threads %d, want the environment's 3", n)
	}
}
