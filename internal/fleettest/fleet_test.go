package fleettest

import (
	"os"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/redistest"
)

func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

// skews gives the worker processes local clocks up to 2 s apart. The
// limiter never reads them for a decision, so the fleet conforms anyway.
var skews = []time.Duration{2 * time.Second, -2 * time.Second, 0, 1500 * time.Millisecond}

func check(t *testing.T, rep Report, lim fleetrate.Limit) {
	t.Helper()
	if len(rep.Errors) > 0 {
		t.Fatalf("workers failed: %v", rep.Errors)
	}
	if len(rep.Grants) == 0 {
		t.Fatal("no grants")
	}
	if err := CheckWindows(rep.Grants, lim); err != nil {
		t.Fatal(err)
	}
	if err := CheckFIFO(rep.Grants); err != nil {
		t.Fatal(err)
	}
}

func TestFleetWaitMode(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(400, 40)
	rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: lim, Skews: skews})
	check(t, rep, lim)
	capacity := float64(lim.Burst) + lim.Rate*rep.Span.Seconds()
	util := float64(len(rep.Grants)) / capacity
	perGrant := float64(rep.WaitCalls) / float64(rep.WaitGrants)
	t.Logf("4 processes × 16 waiters: %d grants in %v, utilisation %.4f of burst + rate × T, %.4f Redis calls per grant",
		len(rep.Grants), rep.Span, util, perGrant)
	if util < 0.98 {
		t.Errorf("utilisation %.4f, want >= 0.98", util)
	}
	if perGrant > 1.05 {
		t.Errorf("%.3f Redis calls per granted Wait, want <= 1.05", perGrant)
	}
}

func TestFleetMixedAllowAndWait(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(300, 30)
	rep := Run(t, Options{Addrs: []string{srv.Addr()}, Limit: lim, AllowEvery: 2, Skews: skews})
	check(t, rep, lim)
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
			o.Addrs, o.Limit, o.Skews = []string{srv.Addr()}, lim, skews
			foldedFleet(t, Run(t, o), lim)
		})
	}
}

func foldedFleet(t *testing.T, rep Report, lim fleetrate.Limit) {
	check(t, rep, lim)
	capacity := float64(lim.Burst) + lim.Rate*rep.Span.Seconds()
	perGrant := float64(rep.WaitCalls) / float64(rep.WaitGrants)
	t.Logf("folded fleet: %d grants in %v, utilisation %.4f, %.4f script calls per granted Wait",
		len(rep.Grants), rep.Span, float64(len(rep.Grants))/capacity, perGrant)
	if perGrant > 1.0 {
		t.Errorf("%.3f script calls per granted Wait, want at most 1 (folding shares calls)", perGrant)
	}
	if err := CheckFIFO(rep.Grants); err != nil {
		t.Fatal(err)
	}
}

// TestFleetLease runs the fleet on Allow with local leases: every window
// stays within burst + rate × window plus the stated overshoot,
// min(processes × (tokens − 1), rate × max age), and leases save calls.
func TestFleetLease(t *testing.T) {
	srv := redistest.Start(t)
	lim := fleetrate.PerSecond(400, 40)
	o := Options{
		Addrs: []string{srv.Addr()}, Limit: lim, Skews: skews, AllowEvery: 1,
		Lease: 8, LeaseMaxAge: 20 * time.Millisecond,
	}
	rep := Run(t, o)
	if len(rep.Errors) > 0 {
		t.Fatalf("workers failed: %v", rep.Errors)
	}
	procs := int64(4) // Run's default
	slack := min(procs*(o.Lease-1), int64(lim.Rate*o.LeaseMaxAge.Seconds()))
	if err := CheckWindowsSlack(rep.Grants, lim, slack); err != nil {
		t.Fatal(err)
	}
	capacity := float64(lim.Burst) + lim.Rate*rep.Span.Seconds()
	perGrant := float64(rep.WaitCalls) / float64(len(rep.Grants))
	t.Logf("leased fleet: %d grants in %v, utilisation %.4f, %.4f script calls per grant (slack %d)",
		len(rep.Grants), rep.Span, float64(len(rep.Grants))/capacity, perGrant, slack)
	if float64(len(rep.Grants)) > capacity+float64(slack) {
		t.Errorf("%d grants, more than the bucket gave (%.0f) and the slack", len(rep.Grants), capacity)
	}
}
