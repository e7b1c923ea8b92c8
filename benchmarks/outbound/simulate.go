package outbound

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/internal/cli/mockota"
	"github.com/fleetrate/fleetrate/memstore"
	"github.com/fleetrate/fleetrate/transport"
)

// direct calls a handler in the caller's goroutine, after a latency: an
// upstream without a network, for a simulation on a fake clock. Each call
// takes the latency plus a random share of the jitter (of at most a
// millisecond of it, but for a share tail of the calls, when tail is
// set), half before the handler sees the request and half after.
type direct struct {
	h               http.Handler
	latency, jitter time.Duration
	tail            float64
}

func (d direct) RoundTrip(req *http.Request) (*http.Response, error) {
	latency := d.latency
	if d.jitter > 0 {
		j := d.jitter
		if d.tail > 0 && rand.Float64() >= d.tail {
			j = min(j, time.Millisecond)
		}
		latency += rand.N(j)
	}
	if latency > 0 {
		t := time.NewTimer(latency / 2)
		select {
		case <-req.Context().Done():
			t.Stop()
			return nil, req.Context().Err()
		case <-t.C:
		}
	}
	rec := httptest.NewRecorder()
	d.h.ServeHTTP(rec, req)
	if latency > 0 {
		time.Sleep(latency / 2)
	}
	return rec.Result(), nil
}

// Simulate runs scenario s as Run does, but in one process and on
// whatever clock time.Now reads: the fleet's "processes" are transports
// with limiters of their own sharing one in-memory store, and the upstream
// is called directly after o.Latency plus up to o.Jitter. Inside a testing/synctest
// bubble it is a simulation of the whole fleet, deterministic in time and
// as fast as the CPU allows: the transport's real code, on a fake clock.
func Simulate(s Scenario, o Options, adaptive transport.Adaptive) (Result, error) {
	o = o.withDefaults(60 * time.Second)
	if !(o.JitterTail >= 0 && o.JitterTail <= 1) {
		return Result{}, fmt.Errorf("outbound: jitter tail must be in [0, 1], got %v", o.JitterTail)
	}
	adv, err := mockota.NewAdversary(s.Upstream)
	if err != nil {
		return Result{}, err
	}
	store := memstore.New(memstore.Options{})
	up := upstreamOf(s)
	classify, err := up.Classifier()
	if err != nil {
		return Result{}, err
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	until := start.Add(o.Duration)
	res := Result{Scenario: s.Name}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range o.Processes {
		lim, err := fleetrate.New(store, fleetrate.Config{Buckets: up.Buckets()})
		if err != nil {
			return Result{}, err
		}
		tr, err := transport.New(lim, classify, transport.Options{
			Base: direct{h: adv, latency: o.Latency, jitter: o.Jitter, tail: o.JitterTail}, MaxRetryAfter: maxRetryAfter, Adaptive: adaptive,
			Logger: logger,
		})
		if err != nil {
			return Result{}, err
		}
		client := &http.Client{Transport: tr}
		for range o.Goroutines {
			wg.Go(func() {
				res.call(client, "http://ota.test/avail", until, func() (context.Context, context.CancelFunc) {
					return context.WithDeadline(context.Background(), until)
				}, &mu)
			})
		}
	}
	wg.Wait()
	res.report(s, adv, start, until)
	return res, nil
}
