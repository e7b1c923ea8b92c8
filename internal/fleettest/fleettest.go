// Package fleettest runs the guarantee fleetrate exists for: several OS
// processes, each with many goroutines, share one bucket on a real Redis,
// and together never take more than burst + rate × window in any window.
//
// A test package that uses Run must call Main from its TestMain, so that
// the test binary can re-execute itself as a worker process.
package fleettest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/redistest"
	"github.com/fleetrate/fleetrate/lease"
	"github.com/fleetrate/fleetrate/redisstore"
)

const workerEnv = "FLEETRATE_FLEET_WORKER"

// Options describe one fleet run.
type Options struct {
	// Addrs are the Redis addresses: one for a standalone server, several
	// for a Cluster (Cluster must be true).
	Addrs   []string
	Cluster bool
	// Fold turns on redisstore's FoldHotKeys in every worker.
	Fold bool
	// Batch turns on redisstore's Batch in every worker.
	Batch bool
	// Lease, when not zero, wraps every worker's store in a lease.Store
	// of that many tokens, each lease spendable for LeaseMaxAge. Script
	// calls are then all counted (a lease serves Allow too).
	Lease       int64
	LeaseMaxAge time.Duration
	// Processes and Goroutines size the fleet (defaults 4 and 16).
	Processes, Goroutines int
	// Duration is how long each worker keeps taking (default 3 s).
	Duration time.Duration
	// Limit is the shared bucket's limit.
	Limit fleetrate.Limit
	// AllowEvery makes every AllowEvery-th goroutine use Allow (polling on
	// RetryAfter) instead of Wait; 0 means all wait.
	AllowEvery int
	// Skews are local clock offsets given to the workers' Limiters, round
	// robin over processes.
	Skews []time.Duration
	// Key is the bucket name; the default is unique per run.
	Key string
	// StartAt is when every worker starts taking, set by Run so that the
	// fleet starts together, connections already open.
	StartAt time.Time
}

// Grant is one granted take, timed on the store's clock.
type Grant struct {
	At     int64 // ns since the epoch: the store's decision time plus the booked wait
	Booked int64 // ns: the store's decision time
	N      int64
	Wait   bool
}

// Report is what a run measured.
type Report struct {
	Grants     []Grant // sorted by At
	WaitGrants int
	WaitCalls  int64 // Redis calls made by waiting goroutines
	Errors     []string
	Span       time.Duration
}

type workerOut struct {
	Grants    []Grant
	WaitCalls int64
	Errors    []string
}

// Main runs the worker when the binary was started as one, and returns
// otherwise. Call it first in TestMain.
func Main() {
	spec := os.Getenv(workerEnv)
	if spec == "" {
		return
	}
	var o Options
	if err := json.Unmarshal([]byte(spec), &o); err != nil {
		fmt.Fprintln(os.Stderr, "fleettest worker:", err)
		os.Exit(2)
	}
	out := work(o)
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		os.Exit(2)
	}
	os.Exit(0)
}

// Run starts o.Processes worker processes and collects their grants.
func Run(t testing.TB, o Options) Report {
	t.Helper()
	if o.Processes == 0 {
		o.Processes = 4
	}
	if o.Goroutines == 0 {
		o.Goroutines = 16
	}
	if o.Duration == 0 {
		o.Duration = 3 * time.Second
	}
	if o.Key == "" {
		o.Key = fmt.Sprintf("{fleet}/%d", time.Now().UnixNano())
	}
	o.StartAt = time.Now().Add(1500 * time.Millisecond)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		rep Report
		wg  sync.WaitGroup
	)
	for p := range o.Processes {
		wo := o
		wo.Skews = nil
		if len(o.Skews) > 0 {
			wo.Skews = []time.Duration{o.Skews[p%len(o.Skews)]}
		}
		spec, _ := json.Marshal(wo)
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), workerEnv+"="+string(spec))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			var out workerOut
			decErr := json.NewDecoder(bufio.NewReader(stdout)).Decode(&out)
			waitErr := cmd.Wait()
			mu.Lock()
			defer mu.Unlock()
			if decErr != nil || waitErr != nil {
				rep.Errors = append(rep.Errors, fmt.Sprintf("worker %d: %v %v: %s", p, decErr, waitErr, stderr.String()))
				return
			}
			rep.Grants = append(rep.Grants, out.Grants...)
			rep.WaitCalls += out.WaitCalls
			rep.Errors = append(rep.Errors, out.Errors...)
		})
	}
	wg.Wait()
	slices.SortFunc(rep.Grants, func(a, b Grant) int {
		if a.At != b.At {
			return int(a.At - b.At)
		}
		return int(a.Booked - b.Booked)
	})
	for _, g := range rep.Grants {
		if g.Wait {
			rep.WaitGrants++
		}
	}
	if n := len(rep.Grants); n > 1 {
		rep.Span = time.Duration(rep.Grants[n-1].At - rep.Grants[0].At)
	}
	return rep
}

// countKey marks the context of a waiting goroutine's take, whose script
// calls the fleet counts (connection handshakes are not decisions).
type countKey struct{}

func newClient(o Options, calls *atomic.Int64) redis.UniversalClient {
	var c redis.UniversalClient
	if o.Cluster {
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: o.Addrs, PoolSize: o.Goroutines + 4})
	} else {
		c = redis.NewClient(&redis.Options{Addr: o.Addrs[0], PoolSize: o.Goroutines + 4})
	}
	counter := redistest.ScriptCounter{N: calls}
	if !o.Fold && !o.Batch && o.Lease == 0 {
		// Shared calls belong to no caller's context: count them all.
		counter.Only = func(ctx context.Context) bool { return ctx.Value(countKey{}) != nil }
	}
	c.AddHook(counter)
	return c
}

// work is one worker process: o.Goroutines goroutines taking from the
// shared bucket until o.Duration has passed.
func work(o Options) workerOut {
	var calls atomic.Int64
	c := newClient(o, &calls)
	defer c.Close()
	shared, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, FoldHotKeys: o.Fold, Batch: o.Batch})
	if err != nil {
		return workerOut{Errors: []string{err.Error()}}
	}
	var store fleetrate.Store = shared
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shared.LoadScripts(ctx); err != nil {
		return workerOut{Errors: []string{err.Error()}}
	}
	if o.Lease > 0 {
		if store, err = lease.New(shared, lease.Options{Tokens: o.Lease, MaxAge: o.LeaseMaxAge}); err != nil {
			return workerOut{Errors: []string{err.Error()}}
		}
	}
	skew := time.Duration(0)
	if len(o.Skews) > 0 {
		skew = o.Skews[0]
	}
	lim, err := fleetrate.New(store, fleetrate.Config{
		Buckets: []fleetrate.BucketConfig{{Name: o.Key, Limits: []fleetrate.Limit{o.Limit}}},
		MaxWait: 10 * time.Second,
		Clock:   func() time.Time { return time.Now().Add(skew) },
	})
	if err != nil {
		return workerOut{Errors: []string{err.Error()}}
	}
	var (
		mu  sync.Mutex
		out workerOut
		wg  sync.WaitGroup
	)
	// Open every connection before the start, so that the fleet is
	// saturated from its first grant.
	var warm sync.WaitGroup
	for range o.Goroutines {
		warm.Go(func() { _ = c.Ping(ctx).Err() })
	}
	warm.Wait()
	time.Sleep(time.Until(o.StartAt))
	deadline := o.StartAt.Add(o.Duration)
	for g := range o.Goroutines {
		useAllow := o.AllowEvery > 0 && g%o.AllowEvery == 0
		wg.Go(func() {
			var local []Grant
			var errs []string
			ctx := context.Background()
			for time.Now().Before(deadline) {
				if useAllow {
					res, err := lim.Allow(ctx, o.Key)
					if err != nil {
						errs = append(errs, err.Error())
						break
					}
					if res.Allowed {
						local = append(local, Grant{At: res.At.UnixNano(), Booked: res.At.UnixNano(), N: 1})
					} else {
						time.Sleep(res.RetryAfter)
					}
					continue
				}
				res, err := lim.WaitN(context.WithValue(ctx, countKey{}, true), 1, o.Key)
				if err != nil {
					if !errors.Is(err, fleetrate.ErrBackpressure) {
						errs = append(errs, err.Error())
						break
					}
					continue
				}
				local = append(local, Grant{At: res.At.UnixNano() + int64(res.Wait), Booked: res.At.UnixNano(), N: 1, Wait: true})
			}
			mu.Lock()
			out.Grants = append(out.Grants, local...)
			out.Errors = append(out.Errors, errs...)
			mu.Unlock()
		})
	}
	wg.Wait()
	out.WaitCalls = calls.Load()
	return out
}

// CheckWindows verifies that in every window between two grants the tokens
// granted are at most burst + rate × window, with no slack. It returns the
// first violation.
func CheckWindows(grants []Grant, l fleetrate.Limit) error {
	return CheckWindowsSlack(grants, l, 0)
}

// CheckWindowsSlack is CheckWindows with slack tokens allowed beyond the
// bound in every window (the stated overshoot of a local lease).
func CheckWindowsSlack(grants []Grant, l fleetrate.Limit, slack int64) error {
	for i := range grants {
		var sum int64
		for j := i; j < len(grants); j++ {
			sum += grants[j].N
			window := float64(grants[j].At-grants[i].At) / 1e9
			if float64(sum-slack) > (float64(l.Burst)+l.Rate*window)*(1-1e-9) && exceeds(sum-slack, grants[j].At-grants[i].At, l) {
				return fmt.Errorf("%d tokens granted in a window of %.6fs (grants %d..%d); the bound is %d + %g × window + %d = %.3f",
					sum, window, i, j, l.Burst, l.Rate, slack, float64(l.Burst)+l.Rate*window+float64(slack))
			}
		}
	}
	return nil
}

// exceeds reports exactly, in rational arithmetic, whether sum tokens in
// windowNs nanoseconds exceed burst + rate × window.
func exceeds(sum, windowNs int64, l fleetrate.Limit) bool {
	rate := new(big.Rat).SetFloat64(l.Rate)
	bound := new(big.Rat).Mul(rate, new(big.Rat).SetFrac64(windowNs, 1e9))
	bound.Add(bound, new(big.Rat).SetInt64(l.Burst))
	return new(big.Rat).SetInt64(sum).Cmp(bound) > 0
}

// CheckFIFO verifies that waiters were booked in decision order: a wait
// decided later never got an earlier slot.
func CheckFIFO(grants []Grant) error {
	var waits []Grant
	for _, g := range grants {
		if g.Wait {
			waits = append(waits, g)
		}
	}
	slices.SortStableFunc(waits, func(a, b Grant) int { return int(a.Booked - b.Booked) })
	for i := 1; i < len(waits); i++ {
		if waits[i].Booked > waits[i-1].Booked && waits[i].At < waits[i-1].At {
			return fmt.Errorf("waiter decided at %d got slot %d, before the slot %d of one decided earlier at %d",
				waits[i].Booked, waits[i].At, waits[i-1].At, waits[i-1].Booked)
		}
	}
	return nil
}
