package fleettest

import (
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// TestFleetOnCluster runs the core fleet test (4 processes × 16 waiters)
// on a Redis Cluster of 3 masters with a replica each,
// then again while the hot bucket's slot migrates to another master.
func TestFleetOnCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 1)
	lim := fleetrate.PerSecond(400, 40)

	t.Run("Steady", func(t *testing.T) {
		rep := Run(t, Options{Addrs: cl.Addrs(), Cluster: true, Limit: lim, Key: "{fleet-steady}"})
		check(t, rep, rep.Grants, lim, 0)
		util := utilisation(rep.Grants, lim)
		t.Logf("cluster fleet: %d grants in %v, utilisation %.4f of burst + rate × T, %.4f script calls per granted Wait",
			len(rep.Grants), rep.Span, util, float64(rep.ScriptCalls)/float64(rep.WaitGrants))
		if want := minUtilisation(0.98, rep, rep.Span); util < want {
			t.Errorf("utilisation %.4f, want >= %.4f (0.98 less the scheduling noise)", util, want)
		}
	})

	t.Run("SlotMigrationDuringRun", func(t *testing.T) {
		const name = "{fleet-migrate}/hot"
		slot := redisstore.Slot(fleetrate.DefaultPrefix + name)
		from, err := cl.SlotOwner(slot)
		if err != nil {
			t.Fatal(err)
		}
		var to *redistest.Node
		for _, m := range cl.Masters() {
			if m != from {
				to = m
				break
			}
		}
		askBefore, movedBefore := errorstats(t, from)
		askingBefore := commandstat(t, to, "asking")

		// Run starts the fleet 1.5 s after it is called and runs it for
		// 3 s; the slot moves 1 s into the run and stays migrating, so
		// that clients meet ASK, for 500 ms after its key has moved.
		type span struct {
			start, end time.Time
			err        error
		}
		migrated := make(chan span, 1)
		go func() {
			time.Sleep(2500 * time.Millisecond)
			s := span{start: time.Now()}
			s.err = cl.MigrateSlot(slot, to, 500*time.Millisecond)
			s.end = time.Now()
			migrated <- s
		}()
		rep := Run(t, Options{Addrs: cl.Addrs(), Cluster: true, Limit: lim, Key: name, Duration: 3 * time.Second})
		m := <-migrated
		if m.err != nil {
			t.Fatal(m.err)
		}
		check(t, rep, rep.Grants, lim, 0)
		if owner, err := cl.SlotOwner(slot); err != nil || owner != to {
			t.Fatalf("slot %d is on %v (%v), want %s", slot, owner, err, to.Addr())
		}
		askAfter, movedAfter := errorstats(t, from)
		asking := commandstat(t, to, "asking") - askingBefore
		var before, during, after int
		for _, g := range rep.Grants {
			switch at := time.Unix(0, g.Booked); {
			case at.Before(m.start):
				before++
			case at.After(m.end):
				after++
			default:
				during++
			}
		}
		t.Logf("slot %d moved %s -> %s in %v during the run: %d ASK and %d MOVED redirects answered by the source, %d ASKING on the target; "+
			"%d grants decided before, %d during, %d after the migration; no errors",
			slot, from.Addr(), to.Addr(), m.end.Sub(m.start).Round(time.Millisecond),
			askAfter-askBefore, movedAfter-movedBefore, asking, before, during, after)
		if askAfter == askBefore || asking == 0 {
			t.Error("no ASK redirect was followed: the migration did not overlap the fleet's calls")
		}
		if movedAfter == movedBefore {
			t.Error("no MOVED redirect was answered after the migration")
		}
		if before == 0 || during == 0 || after == 0 {
			t.Error("the fleet did not decide before, during and after the migration")
		}
	})
}

func errorstats(t *testing.T, n *redistest.Node) (ask, moved int) {
	t.Helper()
	st, err := n.Errorstats()
	if err != nil {
		t.Fatal(err)
	}
	return st["ASK"], st["MOVED"]
}

func commandstat(t *testing.T, n *redistest.Node, cmd string) int {
	t.Helper()
	st, err := n.Commandstats()
	if err != nil {
		t.Fatal(err)
	}
	return st[cmd]
}
