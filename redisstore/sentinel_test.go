package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/redisstore"
)

// TestSentinelFailoverDuringFleet runs a fleet of 4 clients (each its own
// go-redis failover client, as 4 processes would have) taking from one
// bucket, and forces a Sentinel failover in the middle. Decisions resume
// on the new master; errors happen only around the switch; and the fleet
// takes at most one burst over burst + rate × T:
//
//   - EmptyAfterFailover, 16 goroutines per client at 200/s burst 40 (the
//     issue's case): each store notices the new master and empties the
//     bucket there until the last slot it had booked on the old one, so
//     that the old master's late grants are not granted again (measured:
//     −0.4 to +14.7 tokens in 12 runs, see docs/OPERATIONS.md);
//   - without it, 8 goroutines per client at 100/s burst 300: the new
//     master starts from the replica's copy of the bucket, so the grants
//     the old master made after it (replication lag, plus the moment
//     between the replica's promotion and the clients following the
//     Sentinels' +switch-master, about 1 s) are granted again; a fill time
//     (3 s) longer than that moment keeps them within a burst.
func TestSentinelFailoverDuringFleet(t *testing.T) {
	for _, tc := range []struct {
		name       string
		empty      bool
		goroutines int
		rate       float64
		burst      int64
	}{
		{"EmptyAfterFailover", true, 16, 200, 40},
		{"FillTimeLongerThanTheSwitch", false, 8, 100, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sentinelFailoverDuringFleet(t, redisstore.Options{Timeout: 2 * time.Second, EmptyAfterFailover: tc.empty, KeepAfterFailover: !tc.empty}, tc.goroutines, tc.rate, tc.burst)
		})
	}
}

func sentinelFailoverDuringFleet(t *testing.T, opts redisstore.Options, goroutines int, rate float64, burst int64) {
	sn := redistest.StartSentinel(t)
	const (
		clients = 4
		runFor  = 6 * time.Second
		failAt  = 2 * time.Second
	)
	lim := fleetrate.PerSecond(rate, burst)
	r, b := rate, float64(burst)
	const name = "sentinel/hot"

	type event struct {
		at  time.Time // local time of an error
		err error
	}
	var (
		mu     sync.Mutex
		grants []time.Time // the granted slots, on the store's clock
		errs   []event
	)
	start := time.Now()
	deadline := start.Add(runFor)
	var wg sync.WaitGroup
	for i := range clients {
		c := sn.FailoverClient()
		if i == 0 {
			c = failoverFromURL(t, sn)
		}
		s, err := redisstore.New(c, opts)
		if err != nil {
			t.Fatal(err)
		}
		l, err := fleetrate.New(s, fleetrate.Config{Limits: []fleetrate.Limit{lim}})
		if err != nil {
			t.Fatal(err)
		}
		for range goroutines {
			wg.Go(func() {
				ctx := context.Background()
				for time.Now().Before(deadline) {
					// Wait books a slot and sleeps until it: one Redis call
					// per grant, so the test costs little CPU.
					res, err := l.WaitN(ctx, 1, name)
					switch {
					case errors.Is(err, fleetrate.ErrBackpressure):
					case err != nil:
						mu.Lock()
						errs = append(errs, event{time.Now(), err})
						mu.Unlock()
						time.Sleep(10 * time.Millisecond)
					default:
						mu.Lock()
						grants = append(grants, res.At.Add(res.Wait))
						mu.Unlock()
					}
				}
			})
		}
	}
	time.Sleep(failAt)
	oldMaster, err := sn.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	failStart := time.Now()
	newMaster, err := sn.Failover()
	failEnd := time.Now()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}

	slices.SortFunc(grants, func(a, b time.Time) int { return a.Compare(b) })
	if len(grants) < 2 {
		t.Fatalf("%d grants", len(grants))
	}
	span := grants[len(grants)-1].Sub(grants[0])
	took := failEnd.Sub(failStart)
	conforming := b + r*span.Seconds()
	bound := 2*b + r*span.Seconds()
	var after int
	for _, g := range grants {
		if g.After(failEnd) {
			after++
		}
	}
	var lastErr time.Time
	for _, e := range errs {
		if e.at.Before(failStart) || e.at.After(failEnd.Add(time.Second)) {
			t.Errorf("error at %v, outside the failover (%v to %v): %v",
				e.at.Sub(start), failStart.Sub(start), failEnd.Sub(start), e.err)
		}
		if e.at.After(lastErr) {
			lastErr = e.at
		}
	}
	errWindow := "none"
	if len(errs) > 0 {
		errWindow = fmt.Sprintf("the last %v after the failover began; first: %v", lastErr.Sub(failStart).Round(time.Millisecond), errs[0].err)
	}
	t.Logf("failover %s -> %s took %v; %d errors (%s)", oldMaster, newMaster, took.Round(time.Millisecond), len(errs), errWindow)
	t.Logf("granted %d in %v: %+.0f over burst + rate × T = %.0f (%.2f s of rate), bound 2 × burst + rate × T = %.0f; %d grants after the failover",
		len(grants), span.Round(time.Millisecond), float64(len(grants))-conforming, conforming,
		(float64(len(grants))-conforming)/r, bound, after)
	// What the old master grants unseen by the new one is at most what it
	// could grant when the replica last copied it (a burst; the fleet's
	// 32 waiters book fewer ahead) plus the rate over the switch, which
	// ends within the failover: this bound holds whatever the timings.
	if general := bound + r*took.Seconds(); float64(len(grants)) > general {
		t.Errorf("%d granted, more than 2 × burst + rate × (T + failover) = %.0f", len(grants), general)
	}
	// With EmptyAfterFailover, and without it when the failover is shorter
	// than the bucket's fill time, that is within one extra burst: the
	// issue's bound. (With EmptyAfterFailover the runs measured stayed
	// within 15 tokens of burst + rate × T, most within 3: the bound leaves
	// the rest of the burst for the machine's noise.)
	if (opts.EmptyAfterFailover || took.Seconds() < b/r) && float64(len(grants)) > bound {
		t.Errorf("%d granted, more than 2 × burst + rate × T = %.0f", len(grants), bound)
	}
	// Decisions resumed on the new master: it holds the bucket, written
	// after the switch, and the fleet kept being granted at the rate.
	if least := r * (deadline.Sub(failEnd).Seconds() - 1); float64(after) < least {
		t.Errorf("%d grants after the failover, want at least %.0f", after, least)
	}
	direct := redis.NewClient(&redis.Options{Addr: newMaster})
	defer direct.Close()
	ds, err := redisstore.New(direct, redisstore.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st, ok, err := ds.State(context.Background(), fleetrate.DefaultPrefix+name)
	if err != nil || !ok {
		t.Fatalf("the new master holds no bucket: %v, %v", ok, err)
	}
	if stamp := time.UnixMicro(st.Stamp); !stamp.After(failEnd) {
		t.Errorf("the new master's bucket was last written at %v, before the failover ended at %v", stamp, failEnd)
	}
}

// failoverFromURL builds a failover client the way an operator would,
// from one URL naming the Sentinels and the master:
// redis://sentinel1:port?master_name=mymaster&addr=sentinel2:port&addr=sentinel3:port.
func failoverFromURL(t *testing.T, sn *redistest.Sentinel) *redis.Client {
	t.Helper()
	addrs := sn.SentinelAddrs()
	url := fmt.Sprintf("redis://%s/0?master_name=%s", addrs[0], sn.MasterName())
	for _, a := range addrs[1:] {
		url += "&addr=" + a
	}
	opt, err := redis.ParseFailoverURL(url)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(opt.SentinelAddrs, addrs) || opt.MasterName != sn.MasterName() {
		t.Fatalf("ParseFailoverURL(%q) = sentinels %v, master %q", url, opt.SentinelAddrs, opt.MasterName)
	}
	c := redis.NewFailoverClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
