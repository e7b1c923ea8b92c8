package outbound

import (
	"flag"
	"log/slog"
	"math"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/fleetrate/fleetrate/transport"
)

var (
	simDuration = flag.Duration("outbound.simduration", 300*time.Second, "how long TestSimulatedFleet simulates each scenario")
	simLatency  = flag.Duration("outbound.simlatency", 2*time.Millisecond, "the simulated upstream's latency")
	simJitter   = flag.Duration("outbound.simjitter", 10*time.Millisecond, "the simulated upstream's jitter: each call takes up to this much more")
	simTail     = flag.Float64("outbound.simtail", 0, "the share of simulated calls that draw from the whole jitter, the others from at most 1 ms of it (0: all draw from the whole)")
	simDecrease = flag.Float64("outbound.decrease", 0, "the adaptive decrease (0: the default)")
	simRecovery = flag.Duration("outbound.recovery", 0, "the adaptive recovery (0: the default)")
	simChart    = flag.String("outbound.simchart", "", "write a PNG chart of the simulated runs to this file")
	simLog      = flag.Bool("outbound.simlog", false, "print the simulated transports' warnings (429s, pauses, rate changes) to stderr")
)

// TestSimulatedFleet runs every scenario of the outbound benchmark in a
// simulation: the transport's real code, 4 "processes" × 16 goroutines
// sharing an in-memory store, against the adversarial upstream, on
// testing/synctest's fake clock with 2 ms of upstream latency plus up to
// 10 ms of jitter, for 5 minutes each (about 5 s of CPU, 70 s under -race
// on a loaded machine). Time is fake, so load does not change the
// figures, but the order goroutines run in does: over those 5 minutes the
// hidden limit reads 86-92 % (over the first 60 s alone, 82-88 %: the
// first two 429s each cost the upstream's 2 s pause). It asserts the
// issue's other targets as they are, and the hidden limit's 85 % less
// that spread. With -outbound.simchart it draws the chart of
// docs/BENCHMARKS.md:
//
//	go test -run TestSimulatedFleet ./benchmarks/outbound -args -outbound.simduration=300s -outbound.simchart=docs/adaptive-sim.png
func TestSimulatedFleet(t *testing.T) {
	var rs []Result
	ss, targets := scenarios()
	for _, s := range ss {
		if !strings.Contains(s.Name, *only) {
			continue
		}
		var r Result
		synctest.Test(t, func(t *testing.T) {
			var err error
			o := Options{Duration: *simDuration, Latency: *simLatency, Jitter: *simJitter, JitterTail: *simTail}
			if *simLog {
				o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			}
			r, err = Simulate(s, o, transport.Adaptive{Decrease: *simDecrease, Recovery: *simRecovery})
			if err != nil {
				t.Fatal(err)
			}
		})
		// Judged outside the bubble: a failure inside it ends the test.
		rs = append(rs, r)
		if *perSec {
			t.Logf("%s, accepted/limited per second: %s", s.Name, r.Series)
		}
		func() {
			if len(r.Errors) > 0 {
				t.Errorf("%s: worker errors: %v", s.Name, r.Errors)
			}
			if !targets {
				return // another hidden limit or pace: a measurement only
			}
			// The target for a hidden limit is 85 %; runs of this
			// simulation read 86-92 % over 5 minutes (the order goroutines
			// run in varies, and more so under -race), so the assertion is
			// the lowest seen less a margin.
			want, maxLimited := 0.80, 0.02
			switch {
			case strings.HasPrefix(s.Name, "documented"):
				want, maxLimited = 0.95, 0
			case strings.HasSuffix(s.Name, "without Spacing"):
				// A measurement: the row shows what declaring the
				// window buys; without it the fleet meets the window's
				// edges.
				want, maxLimited = 0, 1
			case strings.HasPrefix(s.Name, "strict"):
				// The window is declared as the endpoint's Spacing. Most
				// answers of this jitter (up to 10 ms) are late, and each
				// holds the spacing gate for the next request: 91 % over
				// 5 minutes and over the first one, with no 429, in every
				// run seen.
				want, maxLimited = 0.87, 0.002
			case strings.Contains(s.Name, "huge"):
				// Each 429 pauses the fleet for the 5 s cap: the share
				// is not the point, the cap honoured fleet-wide is.
				want = 0
				if r.DuringCap > 0 || r.Backpressure == 0 {
					t.Errorf("%s: %d arrivals within the capped pause, %d backpressure errors; want none, and some", s.Name, r.DuringCap, r.Backpressure)
				}
			}
			if r.Share < want {
				t.Errorf("%s: %.1f %% of the target, want >= %.0f %%", s.Name, 100*r.Share, 100*want)
			}
			if r.LimitedShare > maxLimited {
				t.Errorf("%s: %.1f %% of requests answered 429, want <= %.0f %%", s.Name, 100*r.LimitedShare, 100*maxLimited)
			}
			if r.DuringPause > 0 {
				t.Errorf("%s: %d requests arrived during an announced pause", s.Name, r.DuringPause)
			}
		}()
	}
	t.Logf("simulated, %v per upstream:\n%s", *simDuration, Table(rs))
	if *simChart != "" {
		writeChart(t, *simChart, rs)
	}
}

func TestSimulateRefusesABadJitterTail(t *testing.T) {
	for _, tail := range []float64{-0.1, 1.5, math.NaN()} {
		_, err := Simulate(Scenarios()[0], Options{Duration: time.Second, JitterTail: tail}, transport.Adaptive{})
		if err == nil || !strings.Contains(err.Error(), "jitter tail") {
			t.Errorf("JitterTail %v: err = %v, want one naming the jitter tail", tail, err)
		}
	}
}
