package main

import (
	"log/slog"
	"os/exec"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/procs"
)

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
// environment, and an empty GOMAXPROCS whatever the test's environment
// sets): idle, it runs on one processor, and its metrics say so. The
// return to Go's default under load is TestGovernFollowsTheLoad's
// (internal/procs), on a synthetic clock: a real process cannot be
// promised most of a CPU on a shared test machine.
func TestServeAdaptiveProcs(t *testing.T) {
	t.Parallel()
	child := startServeChild(t, []string{"GOMAXPROCS="}, "--adaptive-procs", "--log-level", "debug")
	start := child.waitLine("processors: adaptive", "processors: one CPU, two processors")
	if start["msg"] == "processors: one CPU, two processors" {
		if start["gomaxprocs"] != float64(oneCPUProcs) {
			t.Fatalf("one CPU, but gomaxprocs %v, want %d", start["gomaxprocs"], oneCPUProcs)
		}
		return // nothing to govern on this machine
	}
	full, _ := start["default"].(float64)
	if full < 2 || start["one_below_cpus"] != procs.DefaultQuiet || start["default_above_cpus"] != procs.DefaultBusy {
		t.Fatalf("startup line %v, want Go's default of 2 or more and the thresholds %v and %v", start, procs.DefaultQuiet, procs.DefaultBusy)
	}
	addr := child.waitLine("fleetrate serving")["http"].(string)
	change := child.waitLine("processors")
	if change["from"] != full || change["to"] != float64(1) {
		t.Fatalf("first change %v, want from %v to 1", change, full)
	}
	if n := gomaxprocsOf(t, addr); n != 1 {
		t.Fatalf("go_sched_gomaxprocs_threads %d after the change to 1 (and no change since: %v)", n, child.held)
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

// TestServeOneCPUTwoProcessors pins `fleetrate serve` to one CPU
// (taskset), where Go's default is one processor: the service runs two
// (oneCPUProcs), says so, and its metrics agree.
func TestServeOneCPUTwoProcessors(t *testing.T) {
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("no taskset (util-linux) to pin the service to one CPU")
	}
	t.Parallel()
	child := startServeChildOn(t, "0", []string{"GOMAXPROCS="}, "--adaptive-procs")
	start := child.waitLine("processors: one CPU, two processors")
	if start["gomaxprocs"] != float64(oneCPUProcs) {
		t.Fatalf("startup line %v, want gomaxprocs %d", start, oneCPUProcs)
	}
	addr := child.waitLine("fleetrate serving")["http"].(string)
	if n := gomaxprocsOf(t, addr); n != oneCPUProcs {
		t.Fatalf("go_sched_gomaxprocs_threads %d on one CPU, want %d", n, oneCPUProcs)
	}
}

// TestRedisGC: a service on Redis collects garbage at redisGCPercent,
// unless the GOGC environment variable chose, and logs which.
func TestRedisGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	var logged strings.Builder
	log := slog.New(slog.NewTextHandler(&logged, nil))

	t.Setenv("GOGC", "")
	debug.SetGCPercent(100)
	setRedisGC(log)
	if got := debug.SetGCPercent(100); got != redisGCPercent {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, redisGCPercent)
	}
	if !strings.Contains(logged.String(), "gogc=400") {
		t.Errorf("GOGC unset: log %q does not say gogc=400", logged.String())
	}

	logged.Reset()
	t.Setenv("GOGC", "150")
	setRedisGC(log)
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=150 in the environment: GC percent set to %d, want it left (100 here)", got)
	}
	if !strings.Contains(logged.String(), "GOGC from the environment") || !strings.Contains(logged.String(), "gogc=150") {
		t.Errorf("GOGC=150: log %q does not name the environment's value", logged.String())
	}
}
