package redisstore_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

var (
	sentinelRuns = flag.Int("sentinel.runs", 0, "TestSentinelOvershootFigures: failovers per Redis setting (0 skips it)")
	sentinelOnly = flag.String("sentinel.only", "", "TestSentinelOvershootFigures: only the settings whose name contains this")
)

// TestSentinelOvershootFigures measures, per Redis setting, how many
// tokens a fleet of 4 failover clients × 16 waiting goroutines takes over
// burst + rate × time through a SENTINEL FAILOVER at 200/s burst 40: the
// grants the old master made after the replica's last copy, which the new
// master grants again, per Redis setting and store options. Run it with
// -sentinel.runs=N (and -sentinel.only=part-of-a-setting's-name).
func TestSentinelOvershootFigures(t *testing.T) {
	if *sentinelRuns <= 0 {
		t.Skip("set -sentinel.runs to measure")
	}
	minReplicas := [][]any{
		{"config", "set", "min-replicas-to-write", "1"},
		{"config", "set", "min-replicas-max-lag", "1"},
	}
	empty := redisstore.Options{Timeout: 2 * time.Second, EmptyAfterFailover: true}
	plain := redisstore.Options{Timeout: 2 * time.Second, KeepAfterFailover: true}
	unbatched, folded := empty, empty
	unbatched.Unbatched = true
	folded.FoldHotKeys = true
	type setting struct {
		name string
		conf [][]any // commands run on both data nodes
		opts redisstore.Options
	}
	settings := []setting{
		{"defaults, EmptyAfterFailover", nil, empty},
		{"library defaults (Options{})", nil, redisstore.Options{}},
		{"defaults, KeepAfterFailover", nil, plain},
		{"min-replicas-to-write 1, min-replicas-max-lag 1, EmptyAfterFailover", minReplicas, empty},
		{"min-replicas-to-write 1, min-replicas-max-lag 1, KeepAfterFailover", minReplicas, plain},
		{"defaults, EmptyAfterFailover, Unbatched", nil, unbatched},
		{"defaults, EmptyAfterFailover, FoldHotKeys", nil, folded},
	}
	if *sentinelOnly != "" {
		settings = slices.DeleteFunc(settings, func(s setting) bool { return !strings.Contains(s.name, *sentinelOnly) })
	}
	for _, st := range settings {
		var overs []float64
		var errCounts []int
		var firstErrs []string
		for range *sentinelRuns {
			sn := redistest.StartSentinel(t)
			for _, srv := range sn.Servers() {
				for _, c := range st.conf {
					if _, err := srv.Do(c...); err != nil {
						t.Fatal(err)
					}
				}
			}
			over, nerr, window, first := sentinelOvershoot(t, sn, st.opts)
			overs = append(overs, over)
			errCounts = append(errCounts, nerr)
			if nerr > 0 {
				firstErrs = append(firstErrs, fmt.Sprintf("%v over %v", first, window.Round(time.Millisecond)))
			}
		}
		slices.Sort(overs)
		t.Logf("%s: tokens over burst + rate × T per failover %v (burst 40); errors %v %q", st.name, overs, errCounts, firstErrs)
	}
}

// sentinelOvershoot runs the fleet through one failover and returns the
// grants over burst + rate × T, the count of errors, the time from the
// first to the last, and the first. Each of the 4 clients has its own
// store, made with opts. The fleet runs for failAt before the fault and
// for runAfter once every Sentinel reports the new master (a kill -9
// takes SentinelDownAfter and an election; SENTINEL FAILOVER about 1.3 s).
func sentinelOvershoot(t *testing.T, sn *redistest.Sentinel, opts redisstore.Options) (over float64, nerr int, window time.Duration, first error) {
	const (
		clients, goroutines = 4, 16
		failAt, runAfter    = 2 * time.Second, 3 * time.Second
		rate, burst         = 200, 40
	)
	lim := fleetrate.PerSecond(rate, burst)
	var (
		mu     sync.Mutex
		grants []time.Time
		t0, t1 time.Time
		wg     sync.WaitGroup
		done   atomic.Bool
	)
	for range clients {
		s, err := redisstore.New(sn.FailoverClient(), opts)
		if err != nil {
			t.Fatal(err)
		}
		l, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{lim}})
		if err != nil {
			t.Fatal(err)
		}
		for range goroutines {
			wg.Go(func() {
				for !done.Load() {
					res, err := l.WaitN(context.Background(), 1, "sentinel/hot")
					mu.Lock()
					switch {
					case errors.Is(err, fleetrate.ErrBackpressure):
					case err != nil:
						nerr++
						if first == nil {
							first, t0 = err, time.Now()
						}
						t1 = time.Now()
					default:
						grants = append(grants, res.At.Add(res.Wait))
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(10 * time.Millisecond)
					}
				}
			})
		}
	}
	time.Sleep(failAt)
	_, err := sentinelFault(sn)
	time.Sleep(runAfter)
	done.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(grants, func(a, b time.Time) int { return a.Compare(b) })
	span := grants[len(grants)-1].Sub(grants[0])
	return float64(len(grants)) - (burst + rate*span.Seconds()), nerr, t1.Sub(t0), first
}
