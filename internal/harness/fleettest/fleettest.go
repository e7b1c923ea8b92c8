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
	"errors"
	"fmt"
	"math"
	"math/big"
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

// goroutine is one caller of a worker process.
type goroutine struct {
	o         Options
	lims      [2]*fleetrate.Limiter
	changeAt  time.Time
	useAllow  bool
	top       bool // makes the top-class requests of Options.TopRate
	rng       *rand.Rand
	grants    []Grant
	cancelled int
	errs      []string
}

// call is one take of a goroutine: the limiter of its phase, the buckets,
// the endpoint (-1 for none) and the tokens.
type call struct {
	lim   *fleetrate.Limiter
	phase int
	names []string
	ep    int
	n     int64
}

// step makes one take and records what the caller did with it. It
// reports false when the goroutine must stop.
func (w *goroutine) step() bool {
	c := w.next()
	ctx := context.Background()
	if w.o.Bulk.Name != "" {
		ctx = fleetrate.WithPriority(ctx, w.o.Bulk.Name)
	}
	if w.useAllow {
		return w.allow(ctx, c)
	}
	cancelled := w.o.CancelFrac > 0 && w.rng.Float64() < w.o.CancelFrac
	if cancelled && w.rng.IntN(2) == 0 {
		return w.reserveAndCancel(ctx, c)
	}
	return w.wait(ctx, c, cancelled)
}

// next draws the next take: its phase from the clock, an endpoint and a
// cost from the options.
func (w *goroutine) next() call {
	c := call{phase: 0, names: []string{w.o.Key}, ep: -1, n: 1}
	if w.o.ChangeTo.Rate != 0 && !time.Now().Before(w.changeAt) {
		c.phase = 1
	}
	c.lim = w.lims[c.phase]
	if w.o.Endpoints > 0 {
		c.ep = w.rng.IntN(w.o.Endpoints)
		c.names = []string{endpoint(w.o.Key, c.ep), w.o.Key}
	}
	if w.o.MaxCost > 1 {
		c.n = 1 + w.rng.Int64N(w.o.MaxCost)
	}
	return c
}

// allow makes c with Allow, sleeping for the retry-after when denied.
func (w *goroutine) allow(ctx context.Context, c call) bool {
	res, err := c.lim.AllowN(ctx, c.n, c.names...)
	if err != nil {
		return w.fail(err)
	}
	if !res.Allowed {
		time.Sleep(res.RetryAfter)
		return true
	}
	slot := res.At.UnixNano()
	w.grants = append(w.grants, Grant{Slot: slot, Act: time.Now().UnixNano(), Booked: slot, N: c.n, Endpoint: c.ep, Phase: c.phase})
	return true
}

// reserveAndCancel makes c as a reservation given back before its slot.
func (w *goroutine) reserveAndCancel(ctx context.Context, c call) bool {
	r, err := c.lim.ReserveN(ctx, c.n, c.names...)
	if err != nil {
		return w.tolerate(err)
	}
	if d := r.Delay(); d > 0 {
		time.Sleep(time.Duration(w.rng.Int64N(int64(d))))
	}
	if err := r.Cancel(ctx); err != nil {
		return w.fail(err)
	}
	w.cancelled++
	return true
}

// wait makes c with Wait: when cancelled, a WaitN whose context ends while
// it is queued; with Options.Deadlines, under a random deadline that the
// booked slot must not pass.
func (w *goroutine) wait(ctx context.Context, c call, cancelled bool) bool {
	var stop context.CancelFunc = func() {}
	switch {
	case cancelled:
		ctx, stop = context.WithCancel(ctx)
		d := time.Duration(w.rng.Int64N(int64(c.lim.MaxWait())))
		t := time.AfterFunc(d, stop)
		defer t.Stop()
	case w.o.Deadlines:
		d := time.Duration(w.rng.Int64N(2 * int64(c.lim.MaxWait())))
		ctx, stop = context.WithTimeout(ctx, d)
	}
	defer stop()
	res, err := c.lim.WaitN(ctx, c.n, c.names...)
	act := time.Now().UnixNano()
	if err != nil {
		if cancelled && errors.Is(err, context.Canceled) {
			w.cancelled++
			return true
		}
		return w.tolerate(err)
	}
	slot := res.At.UnixNano() + int64(res.Wait)
	// The slot is on Redis's clock, the deadline on this process's: one
	// machine, one clock, but Result.At is whole microseconds.
	if dl, ok := ctx.Deadline(); ok && slot > dl.UnixNano()+int64(time.Microsecond) {
		w.errs = append(w.errs, fmt.Sprintf("WaitN booked a slot %v after its context's deadline", time.Duration(slot-dl.UnixNano())))
	}
	w.grants = append(w.grants, Grant{Slot: slot, Act: act, Booked: res.At.UnixNano(), N: c.n, Wait: true, Endpoint: c.ep, Phase: c.phase})
	return true
}

// topStep waits for the next top-class request of this process (Poisson
// arrivals at TopRate/Processes a second), makes it with Wait, and records
// when it was asked and when it acted.
func (w *goroutine) topStep(deadline time.Time) bool {
	gap := time.Duration(w.rng.ExpFloat64() / (w.o.TopRate / float64(w.o.Processes)) * float64(time.Second))
	if time.Now().Add(gap).After(deadline) {
		time.Sleep(time.Until(deadline))
		return false
	}
	time.Sleep(gap)
	asked := time.Now().UnixNano()
	res, err := w.lims[0].WaitN(context.Background(), 1, w.o.Key)
	act := time.Now().UnixNano()
	if err != nil {
		return w.tolerate(err)
	}
	slot := res.At.UnixNano() + int64(res.Wait)
	w.grants = append(w.grants, Grant{Slot: slot, Act: act, Booked: res.At.UnixNano(), N: 1, Wait: true, Endpoint: -1, Top: true, Asked: asked})
	return true
}

// tolerate accepts what a caller of a saturated fleet meets (backpressure,
// its own deadline or cancel) and records anything else.
func (w *goroutine) tolerate(err error) bool {
	if errors.Is(err, fleetrate.ErrBackpressure) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		if errors.Is(err, fleetrate.ErrStoreUnavailable) {
			return w.fail(err) // a context error must not be an outage
		}
		return true
	}
	return w.fail(err)
}

func (w *goroutine) fail(err error) bool {
	w.errs = append(w.errs, err.Error())
	return false
}

// Times returns, for each grant, the instant a check reads: the slot or
// the act.
type Times func(Grant) int64

// Slots reads the library's slots; Acts, the moments callers acted.
var (
	Slots Times = func(g Grant) int64 { return g.Slot }
	Acts  Times = func(g Grant) int64 { return g.Act }
)

// CheckWindows verifies that in every window between two grants' instants
// the tokens used are at most burst + rate × window + slack tokens. It
// returns the largest excess over burst + rate × window it saw (0 when
// none) and an error for the first window beyond the slack.
func CheckWindows(grants []Grant, at Times, l fleetrate.Limit, slack float64) (worst float64, err error) {
	g := slices.Clone(grants)
	slices.SortFunc(g, func(a, b Grant) int { return cmpInt(at(a), at(b)) })
	for i := range g {
		var sum int64
		for j := i; j < len(g); j++ {
			sum += g[j].N
			w := at(g[j]) - at(g[i])
			excess := float64(sum) - (float64(l.Burst) + l.Rate*float64(w)/1e9)
			if excess <= 0 || !exceeds(sum, w, l) {
				continue
			}
			worst = max(worst, excess)
			if excess > slack && err == nil {
				err = fmt.Errorf("%d tokens used in a window of %v (grants %d..%d); the bound is %d + %g × window = %.3f, slack %.3f",
					sum, time.Duration(w), i, j, l.Burst, l.Rate, float64(l.Burst)+l.Rate*float64(w)/1e9, slack)
			}
		}
	}
	return worst, err
}

// exceeds reports exactly, in rational arithmetic, whether sum tokens in
// windowNs nanoseconds exceed burst + rate × window.
func exceeds(sum, windowNs int64, l fleetrate.Limit) bool {
	rate := new(big.Rat).SetFloat64(l.Rate)
	bound := new(big.Rat).Mul(rate, new(big.Rat).SetFrac64(windowNs, 1e9))
	bound.Add(bound, new(big.Rat).SetInt64(l.Burst))
	return new(big.Rat).SetInt64(sum).Cmp(bound) > 0
}

// NoiseSlack is the tolerance, in tokens, that the run's timer noise
// allows where callers act: a caller that woke late by the run's largest
// lateness while another woke early by its smallest narrows a window by
// their difference, which at rate r admits r × that difference more
// tokens than the window's length would, plus one for the token at each
// end.
func NoiseSlack(rep Report, l fleetrate.Limit) float64 {
	spread := rep.Lateness.Max - min(rep.Lateness.Min, 0)
	return math.Ceil(l.Rate*spread.Seconds()) + 1
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
	slices.SortStableFunc(waits, func(a, b Grant) int { return cmpInt(a.Booked, b.Booked) })
	for i := 1; i < len(waits); i++ {
		if waits[i].Booked > waits[i-1].Booked && waits[i].Slot < waits[i-1].Slot {
			return fmt.Errorf("waiter decided at %d got slot %d, before the slot %d of one decided earlier at %d",
				waits[i].Booked, waits[i].Slot, waits[i-1].Slot, waits[i-1].Booked)
		}
	}
	return nil
}

// Filter returns the grants that keep reports true.
func Filter(grants []Grant, keep func(Grant) bool) []Grant {
	var out []Grant
	for _, g := range grants {
		if keep(g) {
			out = append(out, g)
		}
	}
	return out
}
