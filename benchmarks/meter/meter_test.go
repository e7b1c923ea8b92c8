package meter

import (
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate/internal/harness/redistest"
)

func TestMain(m *testing.M) {
	Main()
	os.Exit(m.Run())
}

var (
	duration = flag.Duration("meter.duration", 0, "how long TestMeterFleet runs each scenario (it is skipped without it: TestMeterShort is the short version)")
	only     = flag.String("meter.only", "", "run only the scenarios whose name contains this")
)

// TestMeterFleet runs every scenario with 4 processes × 16 goroutines for
// -meter.duration and logs the table docs/BENCHMARKS.md shows:
//
//	cd benchmarks && go test -count=1 -v -run TestMeterFleet -timeout 30m ./meter -args -meter.duration=60s
//
// Whatever the estimate, the upstream's tokens bucket must never be over.
func TestMeterFleet(t *testing.T) {
	if *duration <= 0 {
		t.Skip("set -meter.duration (60s for the table in docs/BENCHMARKS.md); TestMeterShort is the short version")
	}
	srv := redistest.Start(t)
	var rs []Result
	for _, s := range Scenarios() {
		if !strings.Contains(s.Name(), *only) {
			continue
		}
		r := Run(t, srv.Addr(), s, Options{Duration: *duration})
		if len(r.Errors) > 0 {
			t.Errorf("%s: worker errors: %v", s.Name(), r.Errors)
		}
		if r.Over > 0 {
			t.Errorf("%s: the upstream's tokens bucket was %.0f tokens over its limit", s.Name(), r.Over)
		}
		t.Logf("%s: %d answers, %d 429s, backpressure %d, gave up %d", s.Name(), r.Answered, r.Limited, r.Backpressure, r.GaveUp)
		rs = append(rs, r)
	}
	t.Logf("4 processes × 16 goroutines, %v per row, upstream 360,000 tokens/min (burst 24,000) and 1,800 requests/min; meter 6,000 tokens/s (burst 6,000), 16 in flight:\n%s", *duration, Table(rs))
}

// shortFloor is the least share of the upstream's tokens a minute that
// TestMeterShort accepts with the estimate at the real costs' floor (see
// the test).
const shortFloor = 0.80

// TestMeterShort is the CI version: 6 s of the fleet against a spread of
// real costs, with the estimate at their floor (250) and at their mean
// (500). The upstream's tokens bucket must never be over; with the
// estimate at the floor, every settle charges what was not booked, and
// the upstream must admit at least shortFloor of its tokens a minute over
// the run less its first second. Three 6 s runs measured 108.3 % each on
// the 2-core machine at load 3.5-4 (commits 5d61346 and 35e53a9; the
// costs are seeded, so only late wakes move it): the meter's burst at the
// start and the settles still to come at the end lift a short window
// above the rate. 80 % leaves a loaded machine's late wakes room and
// still fails a fleet that paces well below its meter.
func TestMeterShort(t *testing.T) {
	srv := redistest.Start(t)
	for _, s := range []Scenario{ScenarioFor(Spread, 250), ScenarioFor(Spread, 500)} {
		t.Run(s.Name(), func(t *testing.T) {
			r := Run(t, srv.Addr(), s, Options{Duration: 6 * time.Second})
			t.Logf("%d answers, %d 429s, backpressure %d, gave up %d\n%s", r.Answered, r.Limited, r.Backpressure, r.GaveUp, Table([]Result{r}))
			if len(r.Errors) > 0 {
				t.Fatalf("worker errors: %v", r.Errors)
			}
			if r.Over > 0 {
				t.Errorf("the upstream's tokens bucket was %.0f tokens over its limit", r.Over)
			}
			if s.Estimate == 250 && r.Utilisation < shortFloor {
				t.Errorf("the upstream admitted %.1f %% of its tokens a minute, want at least %.0f %%", 100*r.Utilisation, 100*shortFloor)
			}
			if r.Answered == 0 {
				t.Errorf("the upstream answered nothing")
			}
		})
	}
}
