package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestDemoInFlight runs the two in-flight runs for 2 s on the in-memory
// store and checks the printed table where the upstream stands: with the
// bound, it never had more than 4 requests in flight and refused none.
func TestDemoInFlight(t *testing.T) {
	o := demoOptions{duration: 2 * time.Second, share: 0.9}
	rs, err := runInFlights(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := inFlightVerdict(rs); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printInFlights(&out, o, rs)
	text := strings.NewReplacer("rate only", "rate-only", "rate + in flight 4", "bounded", "peak in flight", "peak").Replace(out.String())
	tab := parseTable(t, text, "credential")
	if got := tab.num(t, "bounded", "429s"); got != 0 {
		t.Errorf("with the bound the upstream refused %d:\n%s", got, out.String())
	}
	if peak := tab.num(t, "bounded", "peak"); peak > demoInFlightBound {
		t.Errorf("with the bound the upstream saw %d in flight:\n%s", peak, out.String())
	}
	if tab.rows["bounded"]["ok/s"] == "0.0" {
		t.Errorf("the bounded run served nothing:\n%s", out.String())
	}
}
