// Package fleettest runs the guarantee fleetrate exists for, where callers
// act: several OS processes, each with many goroutines, share buckets on a
// real Redis, and together never act more than burst + rate × window times
// in any window.
//
// Every worker goroutine records two instants for each token it uses: the
// slot the library booked (the store's decision time plus the booked wait,
// on Redis's clock) and the moment the caller acts, read from its own
// clock right after its wait returns. All processes run on one machine, so
// they share one wall clock with Redis. The slots must meet the bound
// exactly; the acts must meet it within the timer noise measured in the
// same run (how late callers woke, which the report gives).
//
// A test package that uses Run must call Main from its TestMain, so that
// the test binary can re-execute itself as a worker process.
package fleettest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/harness/redistest"
	"github.com/fleetrate/fleetrate/internal/harness/workerproc"
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
	// of that many tokens, each lease spendable for LeaseMaxAge.
	Lease       int64
	LeaseMaxAge time.Duration
	// Processes and Goroutines size the fleet (defaults 4 and 16).
	Processes, Goroutines int
	// Duration is how long each worker keeps taking (default 2 s).
	Duration time.Duration
	// Limit is the shared bucket's limit.
	Limit fleetrate.Limit
	// Endpoints, when not zero, makes every take an atomic take of two
	// buckets: one of Endpoints endpoint buckets (each with EndpointLimit)
	// and the credential-wide bucket Key (with Limit), as an outbound
	// transport takes them.
	Endpoints     int
	EndpointLimit fleetrate.Limit
	// AllowEvery makes every AllowEvery-th goroutine use Allow (polling on
	// RetryAfter) instead of Wait; 0 means all wait.
	AllowEvery int
	// MaxCost, when above 1, gives each take a random cost from 1 to
	// MaxCost.
	MaxCost int64
	// Deadlines gives every Wait a context with a random deadline between
	// 0 and 2 × the limiter's max wait.
	Deadlines bool
	// CancelFrac is the fraction of takes that are given back while they
	// are still queued: half of them as a Reservation cancelled before its
	// slot, half as a WaitN whose context is cancelled before its slot.
	CancelFrac float64
	// ChangeTo, when its rate is set, is the bucket's limit from the
	// middle of the run on: every worker switches at the same instant, as
	// a fleet does on a reload.
	ChangeTo fleetrate.Limit
	// Bulk, when its Name is set, is the priority class of every
	// goroutine's takes (configured on the bucket Key): a bulk job.
	Bulk fleetrate.Priority
	// TopRate, when above 0, adds one goroutine per process that makes
	// top-class waits of one token, arriving at random (Poisson) at
	// TopRate per second over the fleet, while the others run as usual.
	TopRate float64
	// Key is the bucket name; the default is unique per run.
	Key string
	// StartAt is when every worker starts taking, set by Run so that the
	// fleet starts together, connections already open.
	StartAt time.Time
	// Seed seeds the workers' random choices (each adds its process).
	Seed  uint64
	Index int // the worker's process number, set by Run
}

// Grant is one token use: where the library put it and when the caller
// acted on it.
type Grant struct {
	// Slot is the store's decision time plus the booked wait (ns since
	// the epoch, Redis's clock).
	Slot int64
	// Act is when the caller acted: the wall clock read right after its
	// wait returned (ns since the epoch, the same machine's clock).
	Act int64
	// Booked is the store's decision time (ns since the epoch).
	Booked int64
	N      int64
	Wait   bool
	// Endpoint is the endpoint bucket of a two-bucket take, or -1.
	Endpoint int
	// Phase is 1 for a take decided after ChangeTo took effect, else 0.
	Phase int
	// Top marks a top-class request of Options.TopRate; Asked is when its
	// caller asked (the local clock, ns since the epoch).
	Top   bool
	Asked int64
}

// Report is what a run measured.
type Report struct {
	Grants     []Grant // sorted by Slot
	WaitGrants int
	// Cancelled counts the bookings given back before their slot.
	Cancelled int
	// ScriptCalls counts, from the server's INFO commandstats, every
	// script call of the run (takes, cancels, refunds).
	ScriptCalls int64
	Errors      []string
	Span        time.Duration
	// Lateness is how late callers acted after their slot: its quantiles
	// and extremes measure the run's timer noise.
	Lateness Quantiles
}

// Quantiles summarise a set of durations.
type Quantiles struct {
	Min, P50, P99, Max time.Duration
}

func (q Quantiles) String() string {
	return fmt.Sprintf("min %v p50 %v p99 %v max %v", q.Min, q.P50, q.P99, q.Max)
}

type workerOut struct {
	Grants    []Grant
	Cancelled int
	Errors    []string
}

// Main runs the worker when the binary was started as one, and returns
// otherwise. Call it first in TestMain.
func Main() { workerproc.Main(workerEnv, work) }

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
		o.Duration = 2 * time.Second
	}
	if o.Key == "" {
		o.Key = fmt.Sprintf("{fleet}/%d", time.Now().UnixNano())
	}
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	t.Logf("fleet seed %d", o.Seed)
	o.StartAt = time.Now().Add(1500 * time.Millisecond)
	callsBefore := scriptCalls(t, o)
	specs := make([]Options, o.Processes)
	for p := range specs {
		specs[p] = o
		specs[p].Index = p
	}
	var rep Report
	workerproc.Run(t, workerEnv, specs, func(_ int, out workerOut, err error) {
		if err != nil {
			rep.Errors = append(rep.Errors, err.Error())
			return
		}
		rep.Grants = append(rep.Grants, out.Grants...)
		rep.Cancelled += out.Cancelled
		rep.Errors = append(rep.Errors, out.Errors...)
	})
	rep.ScriptCalls = scriptCalls(t, o) - callsBefore
	slices.SortFunc(rep.Grants, func(a, b Grant) int {
		if a.Slot != b.Slot {
			return cmpInt(a.Slot, b.Slot)
		}
		return cmpInt(a.Booked, b.Booked)
	})
	late := make([]time.Duration, 0, len(rep.Grants))
	for _, g := range rep.Grants {
		if g.Wait {
			rep.WaitGrants++
		}
		late = append(late, time.Duration(g.Act-g.Slot))
	}
	if n := len(rep.Grants); n > 1 {
		rep.Span = time.Duration(rep.Grants[n-1].Slot - rep.Grants[0].Slot)
		slices.Sort(late)
		rep.Lateness = Quantiles{Min: late[0], P50: late[n/2], P99: late[n*99/100], Max: late[n-1]}
	}
	return rep
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// scriptCalls sums the script calls the fleet's Redis servers have served
// (redistest.ScriptCalls).
func scriptCalls(t testing.TB, o Options) int64 {
	t.Helper()
	var total int64
	for _, addr := range o.Addrs {
		n, err := redistest.ScriptCalls(addr)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

func newClient(o Options) redis.UniversalClient {
	if o.Cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: o.Addrs, PoolSize: o.Goroutines + 4})
	}
	return redis.NewClient(&redis.Options{Addr: o.Addrs[0], PoolSize: o.Goroutines + 4})
}

// limiters returns the worker's Limiter for the run's first limit and, when
// the limit changes, for the second; both over the same store.
func limiters(o Options, store fleetrate.Store) ([2]*fleetrate.Limiter, error) {
	var out [2]*fleetrate.Limiter
	for i, l := range []fleetrate.Limit{o.Limit, o.ChangeTo} {
		if l.Rate == 0 {
			out[i] = out[0]
			continue
		}
		cfg := fleetrate.Config{
			Buckets: []fleetrate.BucketConfig{{Name: o.Key, Limits: []fleetrate.Limit{l}}},
			MaxWait: 2 * time.Second,
		}
		if o.Bulk.Name != "" {
			cfg.Buckets[0].Priorities = []fleetrate.Priority{o.Bulk}
		}
		for e := range o.Endpoints {
			cfg.Buckets = append(cfg.Buckets, fleetrate.BucketConfig{Name: endpoint(o.Key, e), Limits: []fleetrate.Limit{o.EndpointLimit}})
		}
		lim, err := fleetrate.New(store, cfg)
		if err != nil {
			return out, err
		}
		out[i] = lim
	}
	return out, nil
}

// endpoint names endpoint bucket e of the credential key (on its Cluster
// slot).
func endpoint(key string, e int) string { return fmt.Sprintf("%s/endpoint%d", key, e) }

// work is one worker process: o.Goroutines goroutines taking from the
// shared buckets until o.Duration has passed.
func work(o Options) workerOut {
	c := newClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	store, err := openStore(ctx, o, c)
	if err != nil {
		return workerOut{Errors: []string{err.Error()}}
	}
	lims, err := limiters(o, store)
	if err != nil {
		return workerOut{Errors: []string{err.Error()}}
	}
	// Open every connection before the start, so that the fleet is
	// saturated from its first grant.
	var warm sync.WaitGroup
	for range o.Goroutines {
		warm.Go(func() { _ = c.Ping(ctx).Err() })
	}
	warm.Wait()
	time.Sleep(time.Until(o.StartAt))
	return runGoroutines(o, lims)
}

// openStore is the worker's store: redisstore on c with its scripts
// loaded, behind a lease store when o.Lease is set.
func openStore(ctx context.Context, o Options, c redis.UniversalClient) (fleetrate.Store, error) {
	shared, err := redisstore.New(c, redisstore.Options{Timeout: 5 * time.Second, FoldHotKeys: o.Fold, Batch: o.Batch})
	if err != nil {
		return nil, err
	}
	if err := shared.LoadScripts(ctx); err != nil {
		return nil, err
	}
	if o.Lease > 0 {
		return lease.New(shared, lease.Options{Tokens: o.Lease, MaxAge: o.LeaseMaxAge})
	}
	return shared, nil
}

// runGoroutines runs the worker's goroutines from now until o.Duration
// after o.StartAt and gathers what they did.
func runGoroutines(o Options, lims [2]*fleetrate.Limiter) workerOut {
	var (
		mu  sync.Mutex
		out workerOut
		wg  sync.WaitGroup
	)
	deadline := o.StartAt.Add(o.Duration)
	changeAt := o.StartAt.Add(o.Duration / 2)
	goroutines := o.Goroutines
	if o.TopRate > 0 {
		goroutines++ // the last one makes the top-class requests
	}
	for g := range goroutines {
		w := &goroutine{o: o, lims: lims, changeAt: changeAt, useAllow: o.AllowEvery > 0 && g%o.AllowEvery == 0,
			rng: rand.New(rand.NewPCG(o.Seed, uint64(o.Index*1000+g))), top: g == o.Goroutines}
		wg.Go(func() {
			step := w.step
			if w.top {
				step = func() bool { return w.topStep(deadline) }
			}
			for time.Now().Before(deadline) && step() {
			}
			mu.Lock()
			out.Grants = append(out.Grants, w.grants...)
			out.Cancelled += w.cancelled
			out.Errors = append(out.Errors, w.errs...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
