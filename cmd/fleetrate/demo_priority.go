package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/memstore"
)

// The demo's priority runs: a bulk push and a few booking confirmations
// share one credential bucket, once with every take equal and once with
// the bulk push in a lower class.
const (
	demoBulkWorkers    = 16                    // goroutines of the bulk push
	demoConfirmWorkers = 2                     // workers sending confirmations
	demoConfirmShare   = 0.1                   // confirmations' rate, as a fraction of the bucket's
	demoCredential     = "{booking_com}"       // the shared bucket's name
	demoBulkClass      = "bulk"                // the bulk push's class
	demoPrioBurst      = 4                     // the bucket's burst
	demoBulkReserve    = 2                     // tokens the bulk class leaves for confirmations
	demoBulkHorizon    = 20 * time.Millisecond // how far ahead the bulk class may book
)

// demoPriority returns the credential limit of the priority runs (the
// mock OTA's credential limit at share, burst demoPrioBurst) and the bulk
// class.
func demoPriority(share float64) (fleetrate.Limit, fleetrate.Priority) {
	limit := fleetrate.PerSecond(share*float64(demoOTA().Credential), demoPrioBurst)
	return limit, fleetrate.Priority{Name: demoBulkClass, Reserve: demoBulkReserve, Horizon: demoBulkHorizon}
}

// priorityBound is the longest a confirmation's booked wait can be behind
// a saturating bulk class: Horizon - (Reserve-1) token intervals, at least
// 0 (see fleetrate.Priority), plus one interval for each other
// confirmation worker that may have booked ahead of it.
func priorityBound(limit fleetrate.Limit, bulk fleetrate.Priority) time.Duration {
	iv := time.Duration(limit.Interval())
	own := max(bulk.Horizon-time.Duration(bulk.Reserve-1)*iv, 0)
	return own + time.Duration(demoConfirmWorkers-1)*iv
}

// priorityResult is one priority run's outcome.
type priorityResult struct {
	classes  bool            // the bulk push had its own class
	waits    []time.Duration // each confirmation's booked wait
	bulk     int             // tokens granted to the bulk push
	duration time.Duration
}

// runPriorities runs the two priority runs at the same time, each on its
// own bucket in the demo's store kind, and returns them: without classes,
// then with.
func runPriorities(ctx context.Context, o demoOptions) ([]priorityResult, error) {
	store, closeStore, err := demoStore(ctx, o)
	if err != nil {
		return nil, err
	}
	defer closeStore()
	start := time.Now().Add(20 * time.Millisecond)
	results := make([]priorityResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, classes := range []bool{false, true} {
		wg.Go(func() {
			prefix := fmt.Sprintf("fleetrate:demo:%d:%d:priority-%t:", os.Getpid(), start.UnixNano(), classes)
			results[i], errs[i] = runPriority(ctx, o, store, prefix, classes, start)
		})
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// runPriority runs the bulk push and the confirmations on one bucket from
// start for o.duration.
func runPriority(ctx context.Context, o demoOptions, store fleetrate.Store, prefix string, classes bool, start time.Time) (priorityResult, error) {
	limit, bulk := demoPriority(o.share)
	bc := fleetrate.BucketConfig{Name: demoCredential, Limits: []fleetrate.Limit{limit}}
	if classes {
		bc.Priorities = []fleetrate.Priority{bulk}
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Prefix: prefix, Buckets: []fleetrate.BucketConfig{bc}})
	if err != nil {
		return priorityResult{}, err
	}
	if err := sleepUntil(ctx, start); err != nil {
		return priorityResult{}, err
	}
	runCtx, cancel := context.WithDeadline(ctx, start.Add(o.duration))
	defer cancel()
	res := priorityResult{classes: classes, duration: o.duration}
	var mu sync.Mutex
	var wg sync.WaitGroup
	bulkCtx := runCtx
	if classes {
		bulkCtx = fleetrate.WithPriority(runCtx, demoBulkClass)
	}
	for range demoBulkWorkers {
		wg.Go(func() {
			n := pushBulk(bulkCtx, lim)
			mu.Lock()
			res.bulk += n
			mu.Unlock()
		})
	}
	every := time.Duration(float64(demoConfirmWorkers) / (demoConfirmShare * limit.Rate) * float64(time.Second))
	for i := range demoConfirmWorkers {
		wg.Go(func() {
			waits := confirm(runCtx, lim, every, time.Duration(i)*every/demoConfirmWorkers)
			mu.Lock()
			res.waits = append(res.waits, waits...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return res, nil
}

// pushBulk takes tokens for the bulk push until ctx ends, and returns how
// many it was granted. Refused (its class's horizon), it tries again when
// the refusal says.
func pushBulk(ctx context.Context, lim *fleetrate.Limiter) int {
	n := 0
	for ctx.Err() == nil {
		_, err := lim.Wait(ctx, demoCredential)
		var bp *fleetrate.BackpressureError
		switch {
		case err == nil:
			n++
		case errors.As(err, &bp):
			_ = sleepUntil(ctx, time.Now().Add(max(bp.RetryAfter, time.Millisecond)))
		default:
			return n // the run ended
		}
	}
	return n
}

// confirm sends a confirmation every period, first after offset, until ctx
// ends, and returns each one's booked wait.
func confirm(ctx context.Context, lim *fleetrate.Limiter, every, offset time.Duration) []time.Duration {
	var waits []time.Duration
	next := time.Now().Add(offset)
	for sleepUntil(ctx, next) == nil {
		res, err := lim.Wait(ctx, demoCredential)
		if err != nil {
			break // the run ended
		}
		waits = append(waits, res.Wait)
		next = next.Add(every)
	}
	return waits
}

// priorityColumns explains the priority table's columns.
var priorityColumns = [][2]string{
	{"confirmations", "confirmations granted (the top class)"},
	{"wait p50, wait p99", "a confirmation's booked wait: how long the limiter made it wait for its slot"},
	{"bulk ok/s", "tokens granted to the bulk push per second: it uses what confirmations leave"},
	{"all ok/s", "tokens granted per second, both together"},
	{"granted, at most", "tokens granted, against the bucket's bound: burst + rate x duration"},
}

// printPriorities prints the two priority runs side by side.
func printPriorities(w io.Writer, o demoOptions, rs []priorityResult) {
	limit, bulk := demoPriority(o.share)
	fmt.Fprintf(w, "priorities: a bulk push (%d goroutines) and booking confirmations (%d workers, %g/s in all) share one credential bucket of %g/s, burst %d, in %s\n",
		demoBulkWorkers, demoConfirmWorkers, demoConfirmShare*limit.Rate, limit.Rate, limit.Burst, o.storeName())
	fmt.Fprintf(w, "  no classes: every take is equal (FIFO); bulk class: the push keeps %d tokens for confirmations and books at most %v ahead\n",
		bulk.Reserve, bulk.Horizon)
	fmt.Fprintf(w, "  with the bulk class, a confirmation's booked wait is at most %v (the class's bound, and the other confirmation worker ahead of it)\n\n",
		priorityBound(limit, bulk).Round(time.Millisecond))
	printTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "credential\tconfirmations\twait p50\twait p99\tbulk ok/s\tall ok/s\tgranted\tat most\t")
		for _, r := range rs {
			name := "no classes"
			if r.classes {
				name = "bulk class"
			}
			secs, all := r.duration.Seconds(), r.bulk+len(r.waits)
			fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%.1f\t%.1f\t%d\t%d\t\n", name, len(r.waits),
				percentile(r.waits, 50).Round(time.Millisecond), percentile(r.waits, 99).Round(time.Millisecond),
				float64(r.bulk)/secs, float64(all)/secs, all, grantBound(limit, r.duration))
		}
	})
	fmt.Fprintln(w, "columns:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range priorityColumns {
		fmt.Fprintf(tw, "  %s\t%s\n", c[0], c[1])
	}
	tw.Flush()
}

// grantBound is the most tokens a bucket of limit grants in d: its burst
// and its rate over d.
func grantBound(limit fleetrate.Limit, d time.Duration) int {
	return int(limit.Burst) + int(limit.Rate*d.Seconds())
}

// demoStore returns the store of the demo's side runs (priorities, in
// flight): in memory, or the Redis of --redis; close it when done.
func demoStore(ctx context.Context, o demoOptions) (fleetrate.Store, func(), error) {
	if o.redis == "" {
		return memstore.New(memstore.Options{}), func() {}, nil
	}
	rs, closeRedis, err := openRedis(ctx, o.redis)
	if err != nil {
		return nil, nil, err
	}
	return rs, closeRedis, nil
}
