package fleettest

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

// check holds a run to the bound where the library puts tokens (its slots:
// exactly, with no slack) and where callers use them (their acts: within
// the timer noise the run measured), and reports both.
func check(t *testing.T, rep Report, grants []Grant, lim fleetrate.Limit, slack float64) {
	t.Helper()
	if len(rep.Errors) > 0 {
		t.Fatalf("workers failed: %v", rep.Errors)
	}
	if len(grants) == 0 {
		t.Fatal("no grants")
	}
	worst, err := CheckWindows(grants, Slots, lim, slack)
	if err != nil {
		t.Fatalf("at the library's slots: %v", err)
	}
	noise := NoiseSlack(rep, lim)
	actWorst, err := CheckWindows(grants, Acts, lim, slack+noise)
	t.Logf("%v: %d grants; worst excess over burst + rate × w: %.3f tokens at slots (slack %.0f), %.3f where callers act (allowed %.0f from lateness %v)",
		lim, len(grants), worst, slack, actWorst, slack+noise, rep.Lateness)
	logRow(t, rep, grants, lim, worst, actWorst, slack+noise)
	if err != nil {
		t.Fatalf("where callers act: %v", err)
	}
}

// fleetTableHead heads docs/BENCHMARKS.md's fleet table. Every check logs
// it with its row; benchmarks/regen.sh (benchdoc tables) merges the rows of
// a `go test -v` run into one table.
const fleetTableHead = "| scenario | limit | tokens used | given back while queued | worst excess at the slots | " +
	"worst excess where callers act (allowed by the run's noise) | caller lateness p50 / p99 / max | script calls per use |\n" +
	"|---|---|---|---|---|---|---|---|"

// logRow logs the fleet table's row for one checked set of grants. The
// cancels and script calls are the whole run's, so a subset of its grants
// (one bucket of several, one phase) shows "—" for them.
func logRow(t *testing.T, rep Report, grants []Grant, lim fleetrate.Limit, worst, actWorst, allowed float64) {
	t.Helper()
	var used int64
	for _, g := range grants {
		used += g.N
	}
	given, calls := "—", "—"
	if len(grants) == len(rep.Grants) {
		if rep.Cancelled > 0 {
			given = fmt.Sprint(rep.Cancelled)
		}
		if rep.ScriptCalls > 0 && used > 0 {
			calls = fmt.Sprintf("%.3f", float64(rep.ScriptCalls)/float64(used))
		}
	}
	l := rep.Lateness
	t.Logf("\n%s\n| %s | %v | %d | %s | %.3f | %.1f (%.0f) | %s / %s / %s | %s |", fleetTableHead,
		strings.TrimPrefix(t.Name(), "TestFleet"), lim, used, given, worst, actWorst, allowed,
		strings.TrimSuffix(ms(l.P50), " ms"), strings.TrimSuffix(ms(l.P99), " ms"), ms(l.Max), calls)
}

// minUtilisation is the least share of burst + rate × span a saturated
// fleet must use: want, less what the machine's scheduling noise can cost
// (a fleet whose processes all stall for the worst lateness seen asks for
// nothing meanwhile).
func minUtilisation(want float64, rep Report, span time.Duration) float64 {
	if span <= 0 {
		return want
	}
	return want - rep.Lateness.Max.Seconds()/span.Seconds()
}

// utilisation is the share of burst + rate × span that the grants used.
func utilisation(grants []Grant, lim fleetrate.Limit) float64 {
	if len(grants) < 2 {
		return 0
	}
	var n int64
	for _, g := range grants {
		n += g.N
	}
	span := time.Duration(grants[len(grants)-1].Slot - grants[0].Slot)
	return float64(n) / (float64(lim.Burst) + lim.Rate*span.Seconds())
}

func TestFleetWait(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(400, 40)
	rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: lim})
	check(t, rep, rep.Grants, lim, 0)
	if err := CheckFIFO(rep.Grants); err != nil {
		t.Fatal(err)
	}
	util := utilisation(rep.Grants, lim)
	perGrant := float64(rep.ScriptCalls) / float64(rep.WaitGrants)
	t.Logf("4 processes × 16 waiters: %d grants in %v, utilisation %.4f, %.4f script calls per grant (INFO commandstats)",
		len(rep.Grants), rep.Span, util, perGrant)
	if want := minUtilisation(0.98, rep, rep.Span); util < want {
		t.Errorf("utilisation %.4f, want >= %.4f (0.98 less the scheduling noise)", util, want)
	}
	if perGrant > 1.05 {
		t.Errorf("%.3f script calls per granted Wait, want <= 1.05", perGrant)
	}
}

// TestFleetCostsAndDeadlines: random costs of 1 to 3 tokens, every wait
// with a random deadline (some shorter than the queue, whose slots WaitN
// gives back at once).
func TestFleetCostsAndDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(400, 3)
	rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: lim, MaxCost: 3, Deadlines: true})
	check(t, rep, rep.Grants, lim, 0)
	if err := CheckFIFO(rep.Grants); err != nil {
		t.Fatal(err)
	}
	t.Logf("utilisation %.4f", utilisation(rep.Grants, lim))
}

// TestFleetCancels gives back 30 % and 50 % of the bookings while they are
// queued (cancelled reservations and cancelled waits), with and without
// batching: a cancel must never give a later booking's slot away twice.
// The burst is small, as an upstream with strict windows has it, so that a
// slot granted twice is a window over the bound, not lost in a burst's
// slack (with burst 40 a fleet could double 39 slots of a window unseen).
func TestFleetCancels(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(300, 2)
	for _, tc := range []struct {
		name  string
		frac  float64
		batch bool
	}{{"30pct", 0.3, false}, {"50pct", 0.5, false}, {"Batch50pct", 0.5, true}} {
		t.Run(tc.name, func(t *testing.T) {
			rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: lim, CancelFrac: tc.frac, Batch: tc.batch, MaxCost: 2})
			check(t, rep, rep.Grants, lim, 0)
			if rep.Cancelled == 0 {
				t.Fatal("nothing was cancelled; the scenario did not happen")
			}
			t.Logf("%d used, %d given back while queued; utilisation %.4f; %.3f script calls per used grant",
				len(rep.Grants), rep.Cancelled, utilisation(rep.Grants, lim), float64(rep.ScriptCalls)/float64(len(rep.Grants)))
		})
	}
}

// TestFleetTwoBuckets takes an endpoint bucket and the credential-wide
// bucket atomically, as the outbound transport does, with cancels: each
// bucket keeps its own bound.
func TestFleetTwoBuckets(t *testing.T) {
	srv := redistest.Start(t)
	cred := fleetrate.PerSecond(400, 2)
	ep := fleetrate.PerSecond(250, 2)
	rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: cred, Endpoints: 2, EndpointLimit: ep, CancelFrac: 0.3})
	check(t, rep, rep.Grants, cred, 0)
	for e := range 2 {
		check(t, rep, Filter(rep.Grants, func(g Grant) bool { return g.Endpoint == e }), ep, 0)
	}
}

// TestFleetMixedAllowAndWait: half the goroutines poll with Allow.
func TestFleetMixedAllowAndWait(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(300, 30)
	rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: lim, AllowEvery: 2})
	check(t, rep, rep.Grants, lim, 0)
	allows := len(rep.Grants) - rep.WaitGrants
	t.Logf("mixed fleet: %d grants (%d by Allow) in %v", len(rep.Grants), allows, rep.Span)
	if allows == 0 {
		t.Error("no Allow was ever granted; the mix did not happen")
	}
}

// TestFleetFoldedHotKey runs the fleet with hot-key folding, and then with
// batching: concurrent takes of each process go out as one script call, and
// the fleet still conforms exactly, with fewer script calls than grants.
func TestFleetFoldedHotKey(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(400, 40)
	for _, o := range []Options{{Fold: true}, {Batch: true}} {
		name := "FoldHotKeys"
		if o.Batch {
			name = "Batch"
		}
		t.Run(name, func(t *testing.T) {
			o.Addrs, o.Limit = []string{srv.Addr()}, lim
			rep := Run(t, o)
			check(t, rep, rep.Grants, lim, 0)
			if err := CheckFIFO(rep.Grants); err != nil {
				t.Fatal(err)
			}
			perGrant := float64(rep.ScriptCalls) / float64(rep.WaitGrants)
			t.Logf("%s fleet: %d grants in %v, utilisation %.4f, %.4f script calls per granted Wait",
				name, len(rep.Grants), rep.Span, utilisation(rep.Grants, lim), perGrant)
			if perGrant > 1.0 {
				t.Errorf("%.3f script calls per granted Wait, want at most 1 (folding shares calls)", perGrant)
			}
		})
	}
}

// TestFleetLease runs the fleet on Allow with local leases: every window
// stays within burst + rate × window plus the stated overshoot,
// min(processes × (tokens − 1), rate × max age), and leases save calls.
func TestFleetLease(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(400, 40)
	o := Options{Addrs: []string{srv.Addr()}, Limit: lim, AllowEvery: 1, Lease: 8, LeaseMaxAge: 20 * time.Millisecond}
	rep := Run(t, o)
	procs := int64(4) // Run's default
	slack := min(procs*(o.Lease-1), int64(lim.Rate*o.LeaseMaxAge.Seconds()))
	check(t, rep, rep.Grants, lim, float64(slack))
	perGrant := float64(rep.ScriptCalls) / float64(len(rep.Grants))
	t.Logf("leased fleet: %d grants in %v, utilisation %.4f, %.4f script calls per grant (stated overshoot %d)",
		len(rep.Grants), rep.Span, utilisation(rep.Grants, lim), perGrant, slack)
}

// TestFleetLimitChange switches every worker from 400/s burst 40 (filled in
// 100 ms) to 100/s burst 20 (filled in 200 ms) in the middle of the run, as
// a reload does: the bucket's state is converted, the takes under the new
// limit keep its bound, and the bucket is not locked out.
func TestFleetLimitChange(t *testing.T) {
	srv := redistest.Start(t)
	before, after := fleetrate.PerSecond(400, 40), fleetrate.PerSecond(100, 20)
	rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: before, ChangeTo: after})
	check(t, rep, Filter(rep.Grants, func(g Grant) bool { return g.Phase == 0 }), before, 0)
	late := Filter(rep.Grants, func(g Grant) bool { return g.Phase == 1 })
	check(t, rep, late, after, 0)
	if len(late) == 0 {
		t.Fatal("no take under the new limit was granted: locked out")
	}
	// Every token used from the first slot under the new limit on, the
	// old limit's bookings still queued there included: the bucket keeps
	// being used at the new rate, not locked out.
	since := Filter(rep.Grants, func(g Grant) bool { return g.Slot >= late[0].Slot })
	// The bucket is not full when the change comes (the fleet keeps it
	// saturated), so the measure is the rate alone: tokens after the first
	// per rate × span.
	util := 0.0
	if len(since) > 1 {
		util = float64(len(since)-1) / (after.Rate * time.Duration(since[len(since)-1].Slot-since[0].Slot).Seconds())
	}
	t.Logf("after the change: %d grants under the new limit, %d in all from its first slot; %.4f of the new rate used",
		len(late), len(since), util)
	var span time.Duration
	if len(since) > 1 {
		span = time.Duration(since[len(since)-1].Slot - since[0].Slot)
	}
	if want := minUtilisation(0.9, rep, span); util < want {
		t.Errorf("after the change the fleet used %.4f of the new rate, want >= %.4f (0.9 less the scheduling noise; locked out?)", util, want)
	}
}
