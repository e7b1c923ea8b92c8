package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate/memstore"
)

// checkPriorityOutput checks the priority table the demo printed: both
// runs, every column explained, no run granting more than the bucket's
// bound, and every confirmation with the bulk class waiting at most the
// printed bound. It returns the table.
func checkPriorityOutput(t *testing.T, out string) demoTable {
	t.Helper()
	i := strings.Index(out, "\npriorities: ")
	if i < 0 {
		t.Fatalf("no priorities section in:\n%s", out)
	}
	out = out[i:]
	// Row names have a space: join them for parseTable.
	out = strings.NewReplacer("no classes", "no-classes", "bulk class", "bulk-class").Replace(out)
	tab := parseTable(t, out, "credential")
	legend := legendKeys(t, out)
	for _, c := range tab.columns[1:] {
		if !legend[c] {
			t.Errorf("priority column %q is not explained; the legend explains %v", c, legend)
		}
	}
	m := regexp.MustCompile(`booked wait is at most (\S+) `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no stated bound in:\n%s", out)
	}
	bound, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatalf("bound %q: %v", m[1], err)
	}
	for _, row := range []string{"no-classes", "bulk-class"} {
		if got, most := tab.num(t, row, "granted"), tab.num(t, row, "at most"); got > most {
			t.Errorf("%s: granted %d, more than the bucket's bound %d", row, got, most)
		}
	}
	if p99 := cellDuration(t, tab, "bulk-class", "wait p99"); p99 > bound {
		t.Errorf("bulk class: a confirmation waited %v, above the stated bound %v:\n%s", p99, bound, out)
	}
	return tab
}

func cellDuration(t *testing.T, tab demoTable, row, col string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(tab.rows[row][col])
	if err != nil {
		t.Fatalf("cell %s/%s: %v", row, col, err)
	}
	return d
}

// TestDemoPriorities runs the two priority runs on a fake clock (the
// in-memory store reads time.Now, which synctest fakes) and checks the
// printed table: with the bulk class, the confirmations wait less than
// without, within the stated bound, while the bulk push still takes most of
// the rate.
func TestDemoPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := demoOptions{duration: 5 * time.Second, share: 0.9}
		var rs []priorityResult
		for i, classes := range []bool{false, true} {
			start := time.Now().Add(20 * time.Millisecond)
			r, err := runPriority(t.Context(), o, memstore.New(memstore.Options{}), "p"+string(rune('0'+i))+":", classes, start)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		var out bytes.Buffer
		out.WriteString("\n")
		printPriorities(&out, o, rs)
		tab := checkPriorityOutput(t, out.String())
		without, with := cellDuration(t, tab, "no-classes", "wait p50"), cellDuration(t, tab, "bulk-class", "wait p99")
		if with >= without {
			t.Errorf("confirmations: p99 %v with the bulk class, p50 %v without; want less with:\n%s", with, without, out.String())
		}
		limit, _ := demoPriority(o.share)
		for _, row := range []string{"no-classes", "bulk-class"} {
			if n := tab.num(t, row, "confirmations"); n < 10 {
				t.Errorf("%s: %d confirmations in %v, want about %v", row, n, o.duration, demoConfirmShare*limit.Rate*o.duration.Seconds())
			}
			// The bulk push uses what the confirmations leave: all the
			// grants come within a token or two of the bucket's bound.
			if got, most := tab.num(t, row, "granted"), tab.num(t, row, "at most"); got < most-int(limit.Burst)-2 {
				t.Errorf("%s: granted %d of at most %d: the bulk push left the bucket idle:\n%s", row, got, most, out.String())
			}
		}
	})
}
