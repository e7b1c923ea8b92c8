package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/statuspage"
	"github.com/fleetrate/fleetrate/transport"
)

// demoStatus serves the status page of the demo's adaptive run: the fleet's
// buckets, decisions and denials, and the mock OTA's endpoints, paused or
// not, with their 429s.
type demoStatus struct {
	counter  *statuspage.Counter
	registry *prometheus.Registry // the adaptive run's transport metrics
	up       transport.Upstream
	run      atomic.Pointer[demoRun]
	page     *statuspage.Page
	addr     string
	close    func()
}

// demoRun is the store and key prefix of the adaptive run in progress.
type demoRun struct {
	store     fleetrate.Store
	prefix    string
	upstreams func(context.Context) ([]statuspage.Upstream, error)
}

// startDemoStatus serves the page on addr (a loopback port by default).
func startDemoStatus(addr string, share float64) (*demoStatus, error) {
	d := &demoStatus{counter: statuspage.NewCounter(), registry: prometheus.NewRegistry(), up: demoUpstream(demoOTA(), share, false)}
	var err error
	d.page, err = statuspage.New(statuspage.Options{
		Store:     demoPeeker{d: d},
		Counter:   d.counter,
		Title:     "fleetrate demo",
		Buckets:   d.buckets,
		Upstreams: d.upstreams,
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--status-addr: %w", err)
	}
	srv := &http.Server{Handler: d.page, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	d.addr, d.close = ln.Addr().String(), func() { srv.Close() }
	return d, nil
}

// attach makes store, under prefix, the one the page shows, and returns it
// wrapped to count the fleet's decisions.
func (d *demoStatus) attach(store fleetrate.Store, prefix string) fleetrate.Store {
	d.run.Store(&demoRun{store: store, prefix: prefix,
		upstreams: statuspage.TransportUpstreams(store, prefix, []transport.Upstream{d.up}, d.registry, demoAdaptive)})
	d.page.Track()
	return d.counter.Wrap(store)
}

func (d *demoStatus) buckets() []statuspage.Bucket {
	r := d.run.Load()
	if r == nil {
		return nil
	}
	var out []statuspage.Bucket
	for _, b := range d.up.Buckets() {
		if strings.HasSuffix(b.Name, "#pause") {
			continue // pause markers show in the upstream table
		}
		out = append(out, statuspage.Bucket{Name: b.Name, Bucket: fleetrate.Bucket{Prefix: r.prefix, Key: b.Name, Limits: b.Limits}})
	}
	return out
}

func (d *demoStatus) upstreams(ctx context.Context) ([]statuspage.Upstream, error) {
	r := d.run.Load()
	if r == nil {
		return nil, nil
	}
	return r.upstreams(ctx)
}

// demoPeeker peeks the store of the run in progress. The page only peeks.
type demoPeeker struct {
	fleetrate.Store
	d *demoStatus
}

// Take implements fleetrate.Store on the current run's store.
func (p demoPeeker) Take(ctx context.Context, req fleetrate.Request) (fleetrate.Result, error) {
	r := p.d.run.Load()
	if r == nil {
		return fleetrate.Result{}, fmt.Errorf("%w: the adaptive run has not started", fleetrate.ErrStoreUnavailable)
	}
	return r.store.Take(ctx, req)
}

// printAddr tells the user where to watch.
func (d *demoStatus) printAddr(w io.Writer) {
	fmt.Fprintf(w, "status page: http://%s/ (live during the adaptive run; try --duration 1m to watch it)\n", d.addr)
}
