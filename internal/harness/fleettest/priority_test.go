package fleettest

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

var priorityBench = flag.Duration("priority.bench", 0, "run the priority benchmark for this long per run (with and without classes) and print its table")

// priorityRun is one run of the priority benchmark's workload: 4 processes
// × 16 bulk waiters saturate a 400/s bucket (burst 40) while top-class
// requests arrive at random at 10 % of the rate (40/s over the fleet).
// With classes, bulk keeps a reserve of 8 and books at most 10 ms ahead.
type priorityRun struct {
	rep              Report
	topBooked        Quantiles // the booked waits of top requests (Redis's clock)
	topSeen          Quantiles // asked to acted (the caller's clock)
	bulkRate         float64   // bulk tokens a second over the span
	topN, bulkN      int
	worstSlot, worst float64
}

var (
	prioLimit = fleetrate.PerSecond(400, 40)
	prioBulk  = fleetrate.Priority{Name: "bulk", Reserve: 8, Horizon: 10 * time.Millisecond}
)

// prioBound is the stated bound on a top request's booked wait behind the
// bulk class: Horizon - (Reserve-1)*T, at least 0.
func prioBound() time.Duration {
	return max(prioBulk.Horizon-time.Duration((prioBulk.Reserve-1)*prioLimit.Interval()), 0)
}

func runPriority(t *testing.T, addr string, d time.Duration, classes bool) priorityRun {
	t.Helper()
	o := Options{Addrs: []string{addr}, Limit: prioLimit, Duration: d, TopRate: prioLimit.Rate / 10, Batch: true}
	if classes {
		o.Bulk = prioBulk
	}
	rep := Run(t, o)
	if len(rep.Errors) > 0 {
		t.Fatalf("workers failed: %v", rep.Errors)
	}
	var r priorityRun
	r.rep = rep
	var booked, seen []time.Duration
	var bulk []Grant
	for _, g := range rep.Grants {
		if g.Top {
			booked = append(booked, time.Duration(g.Slot-g.Booked))
			seen = append(seen, time.Duration(g.Act-g.Asked))
		} else {
			bulk = append(bulk, g)
		}
	}
	r.topN, r.bulkN = len(booked), len(bulk)
	r.topBooked, r.topSeen = quantiles(booked), quantiles(seen)
	if len(bulk) > 1 {
		r.bulkRate = float64(len(bulk)-1) / (float64(bulk[len(bulk)-1].Slot-bulk[0].Slot) / 1e9)
	}
	var err error
	if r.worstSlot, err = CheckWindows(rep.Grants, Slots, prioLimit, 0); err != nil {
		t.Fatalf("at the library's slots, over both classes: %v", err)
	}
	if r.worst, err = CheckWindows(rep.Grants, Acts, prioLimit, NoiseSlack(rep, prioLimit)); err != nil {
		t.Fatalf("where callers act, over both classes: %v", err)
	}
	return r
}

func quantiles(ds []time.Duration) Quantiles {
	if len(ds) == 0 {
		return Quantiles{}
	}
	slices.Sort(ds)
	n := len(ds)
	return Quantiles{Min: ds[0], P50: ds[n/2], P99: ds[n*99/100], Max: ds[n-1]}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

// TestFleetPriority is the short run of the priority benchmark: with
// classes, the top requests' booked waits (on Redis's clock, so without
// timer noise) meet the stated bound at the p99, the bulk job still uses
// most of what the top class leaves, and the bucket's bound holds over
// both classes, exactly at the slots and within the timer noise where
// callers act.
func TestFleetPriority(t *testing.T) {
	if testing.Short() {
		t.Skip("a fleet run")
	}
	srv := redistest.Start(t)
	r := runPriority(t, srv.Addr(), 2*time.Second, true)
	t.Logf("top: %d, booked wait %v; asked to acted %v; bulk %.0f/s; worst excess %.3f at slots, %.3f at acts (lateness %v)",
		r.topN, r.topBooked, r.topSeen, r.bulkRate, r.worstSlot, r.worst, r.rep.Lateness)
	if r.topN < 20 {
		t.Fatalf("only %d top requests", r.topN)
	}
	if r.topBooked.P99 > prioBound() {
		t.Errorf("top requests' booked wait p99 %v, above the bound %v", r.topBooked.P99, prioBound())
	}
	// What the top class leaves is 90 % of the rate; bulk retries on
	// backpressure, so allow it some idle slots on a loaded machine.
	if left := prioLimit.Rate * 0.9; r.bulkRate < 0.8*left {
		t.Errorf("bulk used %.0f/s of the %.0f/s the top class leaves", r.bulkRate, left)
	}
}

// TestFleetPriorityBench is the benchmark of docs/BENCHMARKS.md, run only
// with -priority.bench=<duration>: the same workload without and with
// classes, and a table of what each measured.
func TestFleetPriorityBench(t *testing.T) {
	if *priorityBench <= 0 {
		t.Skip("run with -priority.bench=30s")
	}
	srv := redistest.Start(t)
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n| run | top requests | top booked wait p50 / p99 / max | top asked→acted p50 / p99 | bulk tokens/s | worst excess at slots / acts |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, classes := range []bool{false, true} {
		r := runPriority(t, srv.Addr(), *priorityBench, classes)
		name := "one class"
		if classes {
			name = fmt.Sprintf("bulk: reserve %d, horizon %v", prioBulk.Reserve, prioBulk.Horizon)
		}
		fmt.Fprintf(&sb, "| %s | %d | %s / %s / %s | %s / %s | %.1f | %.3f / %.3f |\n", name, r.topN,
			ms(r.topBooked.P50), ms(r.topBooked.P99), ms(r.topBooked.Max), ms(r.topSeen.P50), ms(r.topSeen.P99),
			r.bulkRate, r.worstSlot, r.worst)
	}
	t.Logf("%v, 4 processes × 16 bulk waiters + top requests at 40/s; stated bound on the top booked wait: %v%s", prioLimit, prioBound(), sb.String())
}
