package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/mockota"
)

// The demo's in-flight runs: an upstream that serves at most
// demoInFlightBound requests at once (and refuses more), called by
// demoInFlightWorkers goroutines paced at demoInFlightRate, once with the
// rate alone and once with the in-flight bound too.
const (
	demoInFlightBound   = 4
	demoInFlightRate    = 40.0
	demoInFlightWorkers = 16
	demoInFlightMin     = 50 * time.Millisecond
	demoInFlightMax     = 250 * time.Millisecond
)

// inFlightResult is one in-flight run's outcome.
type inFlightResult struct {
	bounded   bool
	stats     mockota.ConcurrentStats
	duration  time.Duration
	storeErrs int64 // takes the store failed (timed out), asked again
}

// runInFlights runs the two in-flight runs at the same time, each with
// its own upstream and bucket in the demo's store kind: the rate alone,
// then the rate and the in-flight bound.
func runInFlights(ctx context.Context, o demoOptions) ([]inFlightResult, error) {
	store, closeStore, err := demoStore(ctx, o)
	if err != nil {
		return nil, err
	}
	defer closeStore()
	results := make([]inFlightResult, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, bounded := range []bool{false, true} {
		wg.Go(func() {
			prefix := fmt.Sprintf("fleetrate:demo:%d:%d:inflight-%t:", os.Getpid(), time.Now().UnixNano(), bounded)
			results[i], errs[i] = runInFlight(ctx, o, store, prefix, bounded)
		})
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// runInFlight runs the workers against a fresh upstream for o.duration.
func runInFlight(ctx context.Context, o demoOptions, store fleetrate.Store, prefix string, bounded bool) (inFlightResult, error) {
	up := &mockota.Concurrent{Bound: demoInFlightBound, MinLatency: demoInFlightMin, MaxLatency: demoInFlightMax}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return inFlightResult{}, err
	}
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	bc := fleetrate.BucketConfig{Name: demoCredential, Limits: []fleetrate.Limit{fleetrate.PerSecond(demoInFlightRate, 1)}}
	if bounded {
		bc.InFlight = demoInFlightBound
	}
	lim, err := fleetrate.New(store, fleetrate.Config{Prefix: prefix, Buckets: []fleetrate.BucketConfig{bc}})
	if err != nil {
		return inFlightResult{}, err
	}
	runCtx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: demoInFlightWorkers}}
	url := "http://" + ln.Addr().String() + "/"
	var failed atomic.Value
	var storeErrs atomic.Int64
	var wg sync.WaitGroup
	for range demoInFlightWorkers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				err := callOnce(runCtx, lim, client, url, bounded)
				switch {
				case err == nil || runCtx.Err() != nil:
				case errors.Is(err, fleetrate.ErrStoreUnavailable):
					// A slow or failing store is an error, never a
					// grant: the caller waits a little and asks again.
					storeErrs.Add(1)
					_ = sleepUntil(runCtx, time.Now().Add(50*time.Millisecond))
				default:
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		return inFlightResult{}, err
	}
	return inFlightResult{bounded: bounded, stats: up.Stats(), duration: o.duration, storeErrs: storeErrs.Load()}, nil
}

// callOnce takes the credential's token (and its permit, when bounded),
// calls the upstream and gives the permit back.
func callOnce(ctx context.Context, lim *fleetrate.Limiter, client *http.Client, url string, bounded bool) error {
	var bp *fleetrate.BackpressureError
	if bounded {
		r, err := lim.Acquire(ctx, demoCredential)
		if errors.As(err, &bp) || ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		defer func() { _ = r.Release(context.WithoutCancel(ctx)) }()
	} else if _, err := lim.Wait(ctx, demoCredential); errors.As(err, &bp) || ctx.Err() != nil {
		return nil
	} else if err != nil {
		return err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		return nil // the run ended mid-request
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// printInFlights prints the two in-flight runs side by side.
func printInFlights(w io.Writer, o demoOptions, rs []inFlightResult) {
	fmt.Fprintf(w, "in flight: %d goroutines paced at %g/s call an upstream that serves at most %d at once (%v-%v each) and answers 429 beyond, in %s\n\n",
		demoInFlightWorkers, demoInFlightRate, demoInFlightBound, demoInFlightMin, demoInFlightMax, o.storeName())
	printTable(w, func(tw io.Writer) {
		fmt.Fprintln(tw, "credential\tok/s\t429s\tpeak in flight\tbound\t")
		for _, r := range rs {
			name := "rate only"
			if r.bounded {
				name = fmt.Sprintf("rate + in flight %d", demoInFlightBound)
			}
			fmt.Fprintf(tw, "%s\t%.1f\t%d\t%d\t%d\t\n", name, float64(r.stats.Served)/r.duration.Seconds(), r.stats.Refused, r.stats.Peak, demoInFlightBound)
		}
	})
	for _, r := range rs {
		if r.storeErrs > 0 {
			fmt.Fprintf(w, "  (the store failed %d takes, bounded=%t: each was an error, asked again after 50 ms)\n", r.storeErrs, r.bounded)
		}
	}
}
