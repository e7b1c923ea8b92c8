package redisstore_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/failsafe"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/schednoise"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/redisstore"
)

var (
	recoveryRuns = flag.Int("recovery.runs", 0, "TestRecoveryFigures: outages per fault, client and goroutine count (0 skips it)")
	recoveryAll  = flag.Bool("recovery.all", false, "TestRecoveryFigures: also measure go-redis's default client and a 500 ms cool-off, for comparison")
	failureModes = flag.Bool("failuremodes", false, "TestFailureModes: measure the failure-mode table of docs/OPERATIONS.md")
)

// recoveryClient is a client configuration under test.
type recoveryClient struct {
	name string
	new  func(addr string) *redis.Client
}

var (
	goRedisDefaults = recoveryClient{"go-redis defaults", func(addr string) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: addr})
	}}
	withClientOptions = recoveryClient{"ClientOptions", func(addr string) *redis.Client {
		return redis.NewClient(redisstore.ClientOptions(&redis.Options{Addr: addr}))
	}}
)

// fault takes Redis away for about d and returns the function that
// brings it back (or waits until it is back).
type fault struct {
	name string
	away func(t *testing.T, srv *redistest.Server, d time.Duration) (back func())
}

// do runs a command on srv, failing t on an error.
func do(t *testing.T, srv *redistest.Server, args ...any) {
	if _, err := srv.Do(args...); err != nil {
		t.Errorf("%v: %v", args, err)
	}
}

var (
	killRestart = fault{"kill -9 and restart", func(_ *testing.T, srv *redistest.Server, d time.Duration) func() {
		srv.Kill()
		time.Sleep(d)
		return srv.Restart
	}}
	sigstop = fault{"SIGSTOP and SIGCONT", func(_ *testing.T, srv *redistest.Server, d time.Duration) func() {
		srv.Pause()
		time.Sleep(d)
		return srv.Resume
	}}
	scriptFlush = fault{"SCRIPT FLUSH", func(t *testing.T, srv *redistest.Server, d time.Duration) func() {
		do(t, srv, "script", "flush")
		time.Sleep(d)
		return func() {}
	}}
	oom = fault{"OOM (maxmemory 1, noeviction)", func(t *testing.T, srv *redistest.Server, d time.Duration) func() {
		do(t, srv, "config", "set", "maxmemory", "1")
		time.Sleep(d)
		return func() { do(t, srv, "config", "set", "maxmemory", "0") }
	}}
	clientPause = fault{"CLIENT PAUSE", func(t *testing.T, srv *redistest.Server, d time.Duration) func() {
		do(t, srv, "client", "pause", d.Milliseconds(), "all")
		time.Sleep(d)
		return func() {}
	}}
	debugSleep = fault{"DEBUG SLEEP", func(t *testing.T, srv *redistest.Server, d time.Duration) func() {
		done := make(chan struct{})
		go func() { defer close(done); do(t, srv, "debug", "sleep", d.Seconds()) }()
		time.Sleep(d)
		return func() { <-done }
	}}
)

// recovery is what one outage showed.
type recovery struct {
	// perCaller holds, for each goroutine, how long after Redis was back
	// its first decision by Redis (not by the failure policy) ended.
	perCaller []time.Duration
	// latencies holds the duration of every decision that began while
	// Redis was away.
	latencies []time.Duration
	// noise is the worst scheduling lateness seen during the run.
	noise time.Duration
	// bad counts decisions that broke the fail-open policy (an error, or a
	// denial): there must be none.
	bad int
	// opened counts the times the breaker opened.
	opened int
}

// opens counts the breaker's "circuit open" log lines.
type opens struct{ n *atomic.Int32 }

func (h opens) Enabled(context.Context, slog.Level) bool { return true }
func (h opens) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h opens) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h opens) WithGroup(string) slog.Handler      { return h }

// outageSetup is what outage runs.
type outageSetup struct {
	client recoveryClient
	// opts are the store's options; wrap, when set, puts a store between
	// failsafe and redisstore (a lease).
	opts redisstore.Options
	wrap func(t *testing.T, s fleetrate.Store) fleetrate.Store
	// coolOff is the breaker's (0 for its default).
	coolOff    time.Duration
	goroutines int
	fault      fault
	away       time.Duration
}

// outage runs goroutines taking through failsafe(redisstore) over a
// client made by su.client, fail open, with the store's default timeout;
// takes Redis away with su.fault for su.away, brings it back and measures
// each goroutine's recovery and the decisions made meanwhile.
func outage(t *testing.T, srv *redistest.Server, su outageSetup) recovery {
	t.Helper()
	c := su.client.new(srv.Addr())
	defer c.Close()
	rs, err := redisstore.New(c, su.opts)
	if err != nil {
		t.Fatal(err)
	}
	var inner fleetrate.Store = rs
	if su.wrap != nil {
		inner = su.wrap(t, rs)
	}
	opened := opens{new(atomic.Int32)}
	fs, err := failsafe.New(inner, failsafe.Options{Name: "redis", CoolOff: su.coolOff, Logger: slog.New(opened)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	warm, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = rs.Warm(warm)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	lim := []fleetrate.Limit{fleetrate.PerSecond(1e6, 1e6)}
	var (
		mu             sync.Mutex
		awayAt, backAt time.Time // zero until Redis is away, back
		perGo          = make([]time.Duration, su.goroutines)
		r              recovery
		stop           = make(chan struct{})
		wg             sync.WaitGroup
	)
	for i := range su.goroutines {
		perGo[i] = -1
		req := fleetrate.Request{Buckets: []fleetrate.Bucket{{Key: fmt.Sprintf("rec%d", i%16), Limits: lim}}, N: 1}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				res, err := fs.Take(ctx, req)
				end := time.Now()
				mu.Lock()
				if err != nil || !res.Allowed {
					r.bad++
				}
				if !awayAt.IsZero() && start.After(awayAt) && (backAt.IsZero() || start.Before(backAt)) {
					r.latencies = append(r.latencies, end.Sub(start))
				}
				if !res.Degraded && err == nil && !backAt.IsZero() && perGo[i] < 0 {
					perGo[i] = max(end.Sub(backAt), 0)
				}
				mu.Unlock()
				// Callers answered by an open breaker would otherwise spin
				// and starve the others of the CPU.
				time.Sleep(time.Millisecond)
			}
		})
	}
	watch := schednoise.Start()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	awayAt = time.Now()
	mu.Unlock()
	back := su.fault.away(t, srv, su.away)
	back()
	mu.Lock()
	backAt = time.Now()
	mu.Unlock()
	// Every caller is given two seconds to come back.
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	r.noise = watch.Stop()
	r.opened = int(opened.n.Load())
	for _, d := range perGo {
		if d < 0 {
			d = 2 * time.Second // never came back within the run
		}
		r.perCaller = append(r.perCaller, d)
	}
	return r
}

// quantile returns the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// TestRecoveryAfterOutage takes Redis away (kill -9 and restart on the
// same port; SIGSTOP and SIGCONT) under 32 and 256 goroutines deciding
// through failsafe(redisstore) with a client set up by
// redisstore.ClientOptions, failsafe's default cool-off and a store
// timeout suited to -race on a loaded machine (500 ms), and checks
// that every goroutine is back on Redis well within a second: the 300 ms
// the store is built for (see TestRecoveryFigures for the measured
// figures), plus what the machine's measured scheduling noise allows.
// Without ClientOptions, go-redis stops dialling after PoolSize failed
// dials and checks once a second.
func TestRecoveryAfterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("outages take seconds")
	}
	for _, g := range []int{32, 256} {
		for _, f := range []fault{killRestart, sigstop} {
			t.Run(fmt.Sprintf("%d goroutines/%s", g, f.name), func(t *testing.T) {
				srv := redistest.Start(t)
				// A timeout suited to -race on a loaded machine: with the
				// 50 ms default, calls starved of CPU time out and reopen
				// the breaker (TestRecoveryFigures measures the default).
				opts := redisstore.Options{Timeout: 500 * time.Millisecond}
				r := outage(t, srv, outageSetup{client: withClientOptions, opts: opts, goroutines: g, fault: f, away: time.Second})
				if r.bad > 0 {
					t.Errorf("%d decisions broke the fail-open policy", r.bad)
				}
				p99 := quantile(r.perCaller, 0.99)
				bound := 300*time.Millisecond + schednoise.Allowance(r.noise, 200*time.Millisecond)
				t.Logf("back on Redis after: p50 %v, p99 %v, max %v (scheduling noise %v, bound %v)",
					quantile(r.perCaller, 0.5), p99, slices.Max(r.perCaller), r.noise, bound)
				if p99 > bound {
					t.Errorf("p99 of the callers came back %v after Redis, want within %v (300 ms plus measured scheduling noise)", p99, bound)
				}
			})
		}
	}
}

// TestRecoveryFigures measures the recovery figures docs/OPERATIONS.md
// quotes: run it with -recovery.runs=N (and -recovery.all for the
// comparison with go-redis's defaults).
func TestRecoveryFigures(t *testing.T) {
	if *recoveryRuns <= 0 {
		t.Skip("set -recovery.runs to measure")
	}
	clients := []recoveryClient{withClientOptions}
	coolOffs := []time.Duration{0}
	if *recoveryAll {
		clients = append(clients, goRedisDefaults)
		coolOffs = append(coolOffs, 500*time.Millisecond)
	}
	for _, rc := range clients {
		for _, co := range coolOffs {
			for _, g := range []int{32, 256} {
				for _, f := range []fault{killRestart, sigstop} {
					for _, d := range []time.Duration{time.Second, 5 * time.Second} {
						srv := redistest.Start(t)
						var all []time.Duration
						var perRun []time.Duration
						bad, opened := 0, 0
						var noise time.Duration
						for range *recoveryRuns {
							r := outage(t, srv, outageSetup{client: rc, coolOff: co, goroutines: g, fault: f, away: d})
							all = append(all, r.perCaller...)
							perRun = append(perRun, quantile(r.perCaller, 0.99))
							bad += r.bad
							opened += r.opened
							noise = max(noise, r.noise)
						}
						slices.Sort(perRun)
						t.Logf("%s, cool-off %v, %d goroutines, %s after %v: p50 %v p99 %v max %v over %d callers × %d runs; run p99s %v; policy broken %d times; breaker opened %d times; worst scheduling noise %v",
							rc.name, coolOffOrDefault(co), g, f.name, d, quantile(all, 0.5).Round(time.Millisecond), quantile(all, 0.99).Round(time.Millisecond),
							slices.Max(all).Round(time.Millisecond), g, *recoveryRuns, roundAll(perRun), bad, opened, noise.Round(time.Millisecond))
					}
				}
			}
		}
	}
}

func coolOffOrDefault(d time.Duration) time.Duration {
	if d == 0 {
		return failsafe.DefaultCoolOff
	}
	return d
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

// TestFailureModes measures the failure-mode table of docs/OPERATIONS.md:
// for each fault and each mode of the store, 32 goroutines deciding
// through failsafe(redisstore) fail open, over a client set up by
// ClientOptions, with the default timeout (50 ms) and cool-off (100 ms),
// Redis away for a second. Run it with -failuremodes.
func TestFailureModes(t *testing.T) {
	if !*failureModes {
		t.Skip("set -failuremodes to measure")
	}
	leased := func(t *testing.T, s fleetrate.Store) fleetrate.Store {
		ls, err := lease.New(s, lease.Options{Tokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	modes := []struct {
		name string
		opts redisstore.Options
		wrap func(t *testing.T, s fleetrate.Store) fleetrate.Store
	}{
		// Batching is the default: plain is the store without it.
		{"plain", redisstore.Options{Unbatched: true}, nil},
		{"batched", redisstore.Options{}, nil},
		{"folded", redisstore.Options{FoldHotKeys: true}, nil},
		{"leased", redisstore.Options{}, leased},
	}
	for _, f := range []fault{killRestart, sigstop, scriptFlush, oom, clientPause, debugSleep} {
		for _, m := range modes {
			srv := redistest.Start(t, "--enable-debug-command", "yes")
			r := outage(t, srv, outageSetup{client: withClientOptions, opts: m.opts, wrap: m.wrap, goroutines: 32, fault: f, away: time.Second})
			lat := "no decision began while away"
			if len(r.latencies) > 0 {
				lat = fmt.Sprintf("p99 %v max %v over %d decisions", quantile(r.latencies, 0.99).Round(100*time.Microsecond),
					slices.Max(r.latencies).Round(100*time.Microsecond), len(r.latencies))
			}
			t.Logf("| %s | %s | %s | %d | p50 %v p99 %v max %v | %d | noise %v |", f.name, m.name, lat, r.bad,
				quantile(r.perCaller, 0.5).Round(time.Millisecond), quantile(r.perCaller, 0.99).Round(time.Millisecond),
				slices.Max(r.perCaller).Round(time.Millisecond), r.opened, r.noise.Round(time.Millisecond))
		}
	}
}
