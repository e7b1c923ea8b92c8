package inflight

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
)

var (
	duration = flag.Duration("inflight.duration", 12*time.Second, "how long the fleet runs")
	ttl      = flag.Duration("inflight.ttl", 2*time.Second, "the permits' lease")
	rateFlag = flag.Float64("inflight.rate", 30, "the credential's rate, requests a second")
)

func TestMain(m *testing.M) {
	if raw := os.Getenv(workerEnv); raw != "" {
		var s spec
		if err := json.Unmarshal([]byte(raw), &s); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		_ = json.NewEncoder(os.Stdout).Encode(work(s))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// proc is a worker process and what it wrote.
type proc struct {
	cmd    *exec.Cmd
	out    strings.Builder
	stderr strings.Builder
}

// TestInFlightFleet runs 4 worker processes × 16 goroutines against an
// upstream that admits 8 requests in flight, with a rate of 30/s on the
// credential as well: at a third of the run worker 0 is killed with
// kill -9 mid-request, at half of it worker 1 is stopped with SIGSTOP for
// two leases and then continued. The upstream must never see more than 8
// in flight; after the kill its requests in flight must come back to 8
// once the dead worker's permits and places in the queue lapse (within
// the lease) and a live waiter takes again (within a third of it); the
// figures are printed as a row of docs/BENCHMARKS.md's in-flight table.
func TestInFlightFleet(t *testing.T) {
	const (
		bound      = 8
		procs      = 4
		goroutines = 16
	)
	rate := *rateFlag
	srv := redistest.Start(t)
	up := &mockota.Concurrent{Bound: bound, MinLatency: 50 * time.Millisecond, MaxLatency: 500 * time.Millisecond, By: workerHeader}
	hs := httptest.NewServer(up)
	defer hs.Close()
	noise := schednoise.Start()
	start := time.Now()
	until := start.Add(*duration)
	ps := make([]*proc, procs)
	for i := range ps {
		raw, _ := json.Marshal(spec{Worker: fmt.Sprint(i), Redis: srv.URL(), URL: hs.URL, Prefix: fmt.Sprintf("inflight:%d:", start.UnixNano()), Goroutines: goroutines, Bound: bound, Rate: rate, TTL: *ttl, Until: until})
		exe, _ := os.Executable()
		p := &proc{cmd: exec.Command(exe, "-test.run=^$")}
		p.cmd.Env = append(os.Environ(), workerEnv+"="+string(raw))
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() { _ = p.cmd.Wait() })
	}
	time.Sleep(*duration / 3)
	// Kill worker 0 mid-request: while it holds permits.
	for up.InFlightOf("0") == 0 && time.Since(start) < *duration/2 {
		time.Sleep(time.Millisecond)
	}
	heldAtKill := up.InFlightOf("0")
	killedAt := time.Now()
	_ = ps[0].cmd.Process.Signal(syscall.SIGKILL)
	time.Sleep(max(*duration/2-time.Since(start), 0))
	stoppedAt := time.Now()
	_ = ps[1].cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(2 * *ttl)
	_ = ps[1].cmd.Process.Signal(syscall.SIGCONT)
	wg.Wait()
	end := time.Now()
	worst := noise.Stop()

	var sum result
	var takesOf []int64 // each live worker's takes
	for i, p := range ps {
		if i == 0 {
			continue // killed: it wrote nothing
		}
		var r result
		if err := json.Unmarshal([]byte(p.out.String()), &r); err != nil {
			t.Fatalf("worker %d wrote %q (%v); stderr: %s", i, p.out.String(), err, p.stderr.String())
		}
		sum.add(r)
		sum.Takes += r.Takes
		takesOf = append(takesOf, r.Takes)
		sum.Renews += r.Renews
		sum.Releases += r.Releases
	}
	st, tl := up.Stats(), up.Timeline()
	peak, served, refused, cut := st.Peak, st.Served, st.Refused, st.Cut
	recovered := mockota.FullAgain(tl, killedAt, bound)
	steady := mockota.MeanInFlight(tl, start.Add(time.Second), killedAt)
	runFor := end.Sub(start).Seconds()
	mean := st.Busy.Seconds() / float64(max(served, 1)) // the upstream's mean latency
	tighter := min(rate, bound/mean)
	// Before the kill, the fleet at work with nothing lost: what the
	// bound and the rate together let through.
	steadyFrom := start.Add(time.Second)
	steadyServed := float64(up.ServedBetween(steadyFrom, killedAt)) / killedAt.Sub(steadyFrom).Seconds()
	t.Logf("errors: %v; worker 0 had %d requests in flight when killed; takes %d (workers 1-3: %v), renews %d, releases %d, requests %d, acquired %d, backpressure %d", sum.Errors, heldAtKill, sum.Takes, takesOf, sum.Renews, sum.Releases, sum.Requests, sum.Acquired, sum.Backpressure)
	t.Logf("\n%s\n%s\n| %d × %d, bound %d, %.0f/s, lease %v | %d | %d | %v | %.1f of %d | %.1f/s (%.0f %% of %.1f/s) | %.1f/s (%.0f %%) | %.2f | %d / %d / %d |",
		"| fleet | peak in flight at the upstream | 429s | after the kill, back to the bound in | steady in flight | served before the kill (of what the tighter limit admits) | served over the run, kill and pause included | store calls per request | not held at send / lapsed / cut by the kill |",
		"|---|---|---|---|---|---|---|---|---|",
		procs, goroutines, bound, rate, *ttl, peak, refused, recovered.Round(time.Millisecond), steady, bound,
		steadyServed, 100*steadyServed/tighter, tighter,
		float64(served)/runFor, 100*float64(served)/runFor/tighter,
		float64(sum.Takes+sum.Renews+sum.Releases)/float64(max(sum.Requests, 1)), sum.NotHeld, sum.Lapsed, cut)
	_ = stoppedAt
	if peak > bound || refused > 0 {
		t.Errorf("the upstream saw %d in flight (bound %d) and refused %d", peak, bound, refused)
	}
	// The dead worker's permits and places in the queue lapse within the
	// lease; nothing announces a lapse, so the first live waiter takes the
	// freed permit at its next take, within a third of the lease more.
	// Then 8 requests must be out at once, which the rate and the random
	// latencies delay: 3.46-3.51 s measured at a 2 s lease, quiet and with
	// two CPU hogs, and 4.22 s once with the hogs; hence 2 s beyond, and
	// the scheduling noise measured in the run.
	allow := schednoise.Allowance(worst, 2*time.Second)
	if want := *ttl + *ttl/3 + allow; recovered < 0 || recovered > want {
		t.Errorf("after the kill the requests in flight came back to %d after %v, want within the lease %v, a third of it and %v (%v)", bound, recovered, *ttl, allow, want)
	}
}
