package redisstore_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/workerproc"
	"github.com/fleetrate/fleetrate/redisstore"
)

// sentinelProcRuns is -sentinel.procs: TestSentinelProcessesFigures's
// failovers.
var sentinelProcRuns = flag.Int("sentinel.procs", 0, "TestSentinelProcessesFigures: failovers of 4 worker processes × 16 waiters on the library defaults (0 skips it; -sentinel.kill to kill -9 the master)")

// TestMain lets the test binary run as a fleet worker process
// (sentinelWork).
func TestMain(m *testing.M) {
	workerproc.Main(sentinelWorkerEnv, sentinelWork)
	os.Exit(m.Run())
}

// sentinelWorkerEnv carries a worker process's sentinelSpec.
const sentinelWorkerEnv = "FLEETRATE_REDISSTORE_SENTINEL_WORKER"

// sentinelSpec is one worker process of the fleet: Goroutines waiters on
// one failover client, on the library's default store options, taking
// from Key at Rate/s burst Burst until the file Stop exists.
type sentinelSpec struct {
	Master     string
	Sentinels  []string
	Goroutines int
	Rate       float64
	Burst      int64
	Key        string
	Stop       string
}

// sentinelOut is what a worker process saw: the start of each grant's
// slot (Unix nanoseconds, on the store's clock), and its errors: how many,
// the first and when the first and last came (Unix nanoseconds, this
// machine's clock, which the test process shares).
type sentinelOut struct {
	Grants          []int64
	Errors          int
	FirstErr        string
	FirstAt, LastAt int64
	Setup           string
}

// sentinelWork is a worker process: its waiters take until the stop file
// appears.
func sentinelWork(s sentinelSpec) sentinelOut {
	var out sentinelOut
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Sentinels})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		out.Setup = err.Error()
		return out
	}
	l, err := fleetrate.New(store, fleetrate.Config{Limits: []fleetrate.Limit{fleetrate.PerSecond(s.Rate, s.Burst)}})
	if err != nil {
		out.Setup = err.Error()
		return out
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			if _, err := os.Stat(s.Stop); err == nil {
				cancel()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	type result struct {
		grant int64
		err   error
		at    time.Time
	}
	results := make(chan result, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r := range results {
			switch {
			case r.err == nil:
				out.Grants = append(out.Grants, r.grant)
			case ctx.Err() != nil && errors.Is(r.err, context.Canceled):
			default:
				out.Errors++
				if out.FirstErr == "" {
					out.FirstErr, out.FirstAt = r.err.Error(), r.at.UnixNano()
				}
				out.LastAt = r.at.UnixNano()
			}
		}
	}()
	waiters := make(chan struct{}, s.Goroutines)
	for range s.Goroutines {
		go func() {
			defer func() { waiters <- struct{}{} }()
			for ctx.Err() == nil {
				res, err := l.WaitN(ctx, 1, s.Key)
				if errors.Is(err, fleetrate.ErrBackpressure) {
					continue
				}
				results <- result{grant: res.At.Add(res.Wait).UnixNano(), err: err, at: time.Now()}
				if err != nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	for range s.Goroutines {
		<-waiters
	}
	close(results)
	<-done
	return out
}

// sentinelFleet is what a fleet of worker processes saw through one
// fault: the tokens granted over burst + rate × T, the errors, the time
// from the first error to the last (over all processes), and the first.
type sentinelFleet struct {
	over   float64
	worst  float64 // the most over burst + rate × t in any window t
	grants int
	errs   int
	window time.Duration
	first  string
}

// sentinelProcessesOvershoot runs 4 worker processes × 16 waiters at
// 200/s burst 40, on the library's default store options, through one
// fault (sentinelFault: SENTINEL FAILOVER, or kill -9 of the master with
// -sentinel.kill): 2 s before it and 3 s after every Sentinel reports
// the new master.
func sentinelProcessesOvershoot(t *testing.T, sn *redistest.Sentinel) sentinelFleet {
	const (
		procs, goroutines = 4, 16
		failAt, runAfter  = 2 * time.Second, 3 * time.Second
		rate, burst       = 200, 40
	)
	stop := filepath.Join(t.TempDir(), "stop")
	spec := sentinelSpec{Master: sn.MasterName(), Sentinels: sn.SentinelAddrs(), Goroutines: goroutines,
		Rate: rate, Burst: burst, Key: "sentinel/procs", Stop: stop}
	specs := slices.Repeat([]sentinelSpec{spec}, procs)
	faultErr := make(chan error, 1)
	go func() {
		time.Sleep(failAt)
		_, err := sentinelFault(sn)
		time.Sleep(runAfter)
		if werr := os.WriteFile(stop, nil, 0o600); err == nil {
			err = werr
		}
		faultErr <- err
	}()
	var grants []int64
	var f sentinelFleet
	var firstAt, lastAt int64
	workerproc.Run(t, sentinelWorkerEnv, specs, func(p int, out sentinelOut, err error) {
		if err != nil || out.Setup != "" {
			t.Errorf("worker %d: %v %s", p, err, out.Setup)
			return
		}
		grants = append(grants, out.Grants...)
		f.errs += out.Errors
		if out.Errors > 0 {
			if firstAt == 0 || out.FirstAt < firstAt {
				firstAt, f.first = out.FirstAt, out.FirstErr
			}
			lastAt = max(lastAt, out.LastAt)
		}
	})
	if err := <-faultErr; err != nil {
		t.Fatal(err)
	}
	if len(grants) < 2 {
		t.Fatalf("%d grants", len(grants))
	}
	slices.Sort(grants)
	span := time.Duration(grants[len(grants)-1] - grants[0])
	f.over = float64(len(grants)) - (burst + rate*span.Seconds())
	f.worst = worstWindow(grants, rate, burst)
	f.grants = len(grants)
	f.window = time.Duration(lastAt - firstAt)
	return f
}

// worstWindow is the most that grants (sorted slot starts, Unix
// nanoseconds) took over burst + rate × t in any window [g_i, g_j] of
// length t: the largest (j − i + 1) − burst − rate × (g_j − g_i). Over
// the whole span, an outage's missing grants would hide an overshoot
// after it; a window does not. With A_k = k − rate × g_k it is
// max_j (A_j − min_{i≤j} A_i) + 1 − burst, in one pass.
func worstWindow(grants []int64, rate, burst float64) float64 {
	worst := math.Inf(-1)
	lowest := math.Inf(1)
	for k, g := range grants {
		a := float64(k) - rate*float64(g-grants[0])/1e9
		lowest = min(lowest, a)
		worst = max(worst, a-lowest)
	}
	return worst + 1 - burst
}

// TestSentinelFailoverProcesses runs a fleet of 4 worker processes × 16
// waiters, each process with its own failover client on the library's
// default options, through a SENTINEL FAILOVER at 200/s burst 40: the
// fleet stays within one burst over burst + rate × T, over the whole run
// and in any window of it, as the store empties the bucket on the new
// master.
func TestSentinelFailoverProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a Sentinel failover takes seconds")
	}
	sn := redistest.StartSentinel(t)
	f := sentinelProcessesOvershoot(t, sn)
	t.Logf("4 processes × 16 waiters, defaults: %+.1f tokens over burst + rate × T (burst 40), %+.1f in the worst window, %d grants; %d errors over %v, first %q", f.over, f.worst, f.grants, f.errs, f.window.Round(time.Millisecond), f.first)
	// Measured with the failover margin: at most +0.0 in the worst
	// window over 12 failovers (docs/OPERATIONS.md, Sentinel); without
	// it +30 once in 15. Issue 36's target, half a burst, is the bound.
	if f.over > 20 || f.worst > 20 {
		t.Errorf("%+.1f tokens over burst + rate × T on defaults, %+.1f in the worst window; want at most half a burst (20)", f.over, f.worst)
	}
}

// TestSentinelProcessesFigures measures TestSentinelFailoverProcesses's
// fleet through -sentinel.procs faults (SENTINEL FAILOVER, or kill -9 of
// the master with -sentinel.kill), each on a fresh Sentinel setup.
func TestSentinelProcessesFigures(t *testing.T) {
	if *sentinelProcRuns <= 0 {
		t.Skip("set -sentinel.procs to measure")
	}
	var overs []string
	for range *sentinelProcRuns {
		sn := redistest.StartSentinel(t)
		f := sentinelProcessesOvershoot(t, sn)
		overs = append(overs, fmt.Sprintf("%+.1f (worst window %+.1f)", f.over, f.worst))
		t.Logf("%+.1f tokens over burst + rate × T (burst 40), %+.1f in the worst window, %d grants; %d errors over %v, first %q", f.over, f.worst, f.grants, f.errs, f.window.Round(time.Millisecond), f.first)
	}
	t.Logf("kill -9: %v; over per fault: %v", *sentinelKill, overs)
}
