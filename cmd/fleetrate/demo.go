package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrate/fleetrate/internal/cli/mockota"
)

// Bounds on the demo's flags.
const (
	maxDemoDuration  = 10 * time.Minute
	maxDemoWorkers   = 1000
	maxDemoNaiveRate = 1e6
)

// demoOptions are the demo's flags.
type demoOptions struct {
	duration  time.Duration
	workers   int
	processes int
	rate      float64
	share     float64
	redis     string
	progress  bool
	// statusAddr is where the status page listens; "off" disables it.
	statusAddr string
	status     *demoStatus
}

func (o demoOptions) validate() error {
	switch {
	case o.duration <= 0 || o.duration > maxDemoDuration:
		return fmt.Errorf("--duration must be above 0 and at most %v, got %v", maxDemoDuration, o.duration)
	case o.workers < 1 || o.workers > maxDemoWorkers:
		return fmt.Errorf("--workers must be between 1 and %d, got %d", maxDemoWorkers, o.workers)
	case o.processes < 1 || o.processes > o.workers:
		return fmt.Errorf("--processes must be between 1 and --workers (%d), got %d", o.workers, o.processes)
	case o.processes > 1 && o.redis == "":
		return fmt.Errorf("--processes %d needs --redis: the in-memory store cannot be shared between processes", o.processes)
	case math.IsNaN(o.rate) || o.rate <= 0 || o.rate > maxDemoNaiveRate:
		return fmt.Errorf("--rate must be above 0 and at most %g, got %v", float64(maxDemoNaiveRate), o.rate)
	case math.IsNaN(o.share) || o.share <= 0 || o.share > 1:
		return fmt.Errorf("--share must be above 0 and at most 1, got %v", o.share)
	}
	if err := demoUpstream(demoOTA(), o.share, false).Validate(); err != nil {
		return fmt.Errorf("--share %v: %w", o.share, err)
	}
	return nil
}

// newDemoCmd returns the "demo" command: the README's first command.
func newDemoCmd() *cobra.Command {
	o := demoOptions{duration: 10 * time.Second, workers: 6, processes: 1, rate: 10, share: 0.9, progress: true}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run three fleets side by side against mock OTAs: naive, shared and adaptive",
		Long: fmt.Sprintf(`Demo starts three mock OTAs on loopback ports. Each documents a limit
per endpoint (availability 20/s, rates 5/s, reservations 10/s) and one
for the whole credential (30/s), enforces them exactly over a sliding
1-second window, and also enforces a hidden limit it does not document:
%s admits only %d/s. It answers 429 with Retry-After.
`, demoHidden.Endpoint, demoHidden.Limit) + `
Three fleets of the same workers then run at the same time, each against
its own OTA:
  naive     each worker paces itself with its own local bucket (--rate,
            10/s) and honours Retry-After by itself;
  shared    all workers share fleetrate buckets at --share (90 %) of each
            documented limit, and a 429 pauses the endpoint for the whole
            fleet (transport.Upstream.Fixed: the rates never change);
  adaptive  as shared, and each 429 also lowers the endpoint's shared
            rate, which climbs back while no 429 comes (the default).

It prints the three side by side: what the OTAs counted (sends, answers,
429s by limit, the rate achieved), what the workers counted (requests by
outcome, sends, the wait before sending) and the rate per endpoint, with
what every column means. At the same time a bulk push and a few booking
confirmations share one credential bucket, with and without a priority
class for the bulk push; it prints the confirmations' waits and the bulk
push's rate for both. The command fails if a shared fleet broke
a documented limit. By default the store is in memory and the workers are
goroutines; --redis shares a Redis store, and --processes spreads each
fleet's workers over that many OS processes.`,
		Example: `  fleetrate demo
  fleetrate demo --duration 1m
  fleetrate demo --redis redis://127.0.0.1:6379/0 --processes 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", o.duration, "how long the fleets run")
	f.IntVar(&o.workers, "workers", o.workers, "workers in each fleet")
	f.IntVar(&o.processes, "processes", o.processes, "OS processes to spread each fleet's workers over (needs --redis when above 1)")
	f.Float64Var(&o.rate, "rate", o.rate, "naive fleet: requests per second each worker allows itself")
	f.Float64Var(&o.share, "share", o.share, "shared and adaptive fleets: fraction of each documented limit to pace at")
	f.StringVar(&o.redis, "redis", "", "Redis URL for the shared store, e.g. redis://127.0.0.1:6379/0 (default: in memory)")
	f.BoolVar(&o.progress, "progress", o.progress, "show a live progress line on stderr")
	f.StringVar(&o.statusAddr, "status-addr", "127.0.0.1:0", "where the live status page of the adaptive fleet listens (in-process fleets only); \"off\" disables it")
	cmd.AddCommand(newDemoWorkerCmd())
	return cmd
}

// modeResult is one fleet's outcome: the OTA's counts and the fleet's
// report.
type modeResult struct {
	mode       string
	duration   time.Duration
	endpoints  []mockota.Endpoint
	credential int
	stats      map[string]mockota.Stats
	credPeak   int
	report     fleetReport
}

// documented returns the 429s the OTA sent for documented limits.
func (r modeResult) documented() int {
	n := 0
	for _, s := range r.stats {
		n += s.Documented
	}
	return n
}

// total returns the OTA's counts over every endpoint.
func (r modeResult) total() mockota.Stats {
	var t mockota.Stats
	for _, s := range r.stats {
		t.Requests += s.Requests
		t.Accepted += s.Accepted
		t.Documented += s.Documented
		t.Hidden += s.Hidden
		t.Injected += s.Injected
	}
	t.Peak = r.credPeak
	return t
}

// lockedWriter serialises writes from the progress line and the worker
// processes' stderr copiers, since the writer given may not be safe for
// concurrent use.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// Write writes p to the underlying writer under the lock.
func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// demoFleet is one of the demo's fleets, with its own mock OTA.
type demoFleet struct {
	mode string
	ota  *mockota.OTA
	url  string
	stop func()
}

// startFleetOTA starts a mock OTA for one fleet on a loopback port.
func startFleetOTA(mode string) (*demoFleet, error) {
	ota, err := mockota.New(demoOTA())
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting the mock OTA: %w", err)
	}
	srv := &http.Server{Handler: ota, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return &demoFleet{mode: mode, ota: ota, url: "http://" + ln.Addr().String(), stop: func() { srv.Close() }}, nil
}

// runDemo runs the demo: the three fleets, the priority runs and the
// in-flight runs at the same time, then their tables, and fails if a
// shared fleet broke a documented limit or the bounded run its bound.
func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) error {
	if err := o.validate(); err != nil {
		return err
	}
	if o.redis != "" {
		// Reach Redis before the fleets start, rather than fail after a
		// whole run of the naive fleet, which needs none.
		_, closeRedis, err := openRedis(ctx, o.redis)
		if err != nil {
			return err
		}
		closeRedis()
	}
	if !isTerminal(stderr) {
		stderr = &lockedWriter{w: stderr}
	}
	printHeader(stdout, o)
	if o.statusAddr != "off" && o.processes == 1 {
		var err error
		if o.status, err = startDemoStatus(o.statusAddr, o.share); err != nil {
			return err
		}
		defer o.status.close()
		o.status.printAddr(stdout)
	}
	fmt.Fprintln(stdout)
	// The priority runs go at the same time as the fleets: the demo
	// lasts --duration.
	var prio []priorityResult
	var inflight []inFlightResult
	var prioErr, inflightErr error
	var wg sync.WaitGroup
	wg.Go(func() { prio, prioErr = runPriorities(ctx, o) })
	wg.Go(func() { inflight, inflightErr = runInFlights(ctx, o) })
	results, err := runFleets(ctx, o, stderr)
	wg.Wait()
	if err = errors.Join(err, prioErr, inflightErr); err != nil {
		return err
	}
	printComparison(stdout, o, results)
	fmt.Fprintln(stdout)
	printPriorities(stdout, o, prio)
	fmt.Fprintln(stdout)
	printInFlights(stdout, o, inflight)
	return errors.Join(sharedVerdict(results), inFlightVerdict(inflight))
}

// inFlightVerdict fails the demo if the bounded run's upstream ever had
// more requests in flight than its bound.
func inFlightVerdict(rs []inFlightResult) error {
	for _, r := range rs {
		if r.bounded && (r.stats.Peak > demoInFlightBound || r.stats.Refused > 0) {
			return fmt.Errorf("demo: with the in-flight bound the upstream saw %d in flight (bound %d) and refused %d", r.stats.Peak, demoInFlightBound, r.stats.Refused)
		}
	}
	return nil
}

// runFleets runs the naive, shared and adaptive fleets at the same time,
// each against its own mock OTA, and returns their results in demoModes
// order.
func runFleets(ctx context.Context, o demoOptions, stderr io.Writer) ([]modeResult, error) {
	fleets := make([]*demoFleet, 0, len(demoModes))
	defer func() {
		for _, f := range fleets {
			f.stop()
		}
	}()
	for _, mode := range demoModes {
		f, err := startFleetOTA(mode)
		if err != nil {
			return nil, err
		}
		fleets = append(fleets, f)
	}
	lead := 20 * time.Millisecond
	if o.processes > 1 {
		lead = 1500 * time.Millisecond // time for the processes to start and connect
	}
	start := time.Now().Add(lead)
	stop := func() {}
	if o.progress {
		stop = showProgress(stderr, start, start.Add(o.duration), fleets)
	}
	results := make([]modeResult, len(fleets))
	errs := make([]error, len(fleets))
	var wg sync.WaitGroup
	for i, f := range fleets {
		wg.Go(func() {
			results[i], errs[i] = runMode(ctx, o, f, start, stderr)
		})
	}
	wg.Wait()
	stop()
	return results, errors.Join(errs...)
}

// sharedVerdict fails the demo when a shared or adaptive fleet drew a 429
// from a documented limit: fleetrate's promise is that it never does.
func sharedVerdict(results []modeResult) error {
	var broken []string
	for _, r := range results {
		if r.mode == modeNaive {
			continue
		}
		for _, e := range r.endpoints {
			if n := r.stats[e.Name].Documented; n > 0 {
				broken = append(broken, fmt.Sprintf("%s: %s %d", r.mode, e.Name, n))
			}
		}
	}
	if len(broken) > 0 {
		return fmt.Errorf("a shared fleet broke a documented limit: the OTA answered 429 for documented limits (%s)", strings.Join(broken, ", "))
	}
	return nil
}

// runMode runs one fleet from start for o.duration against its OTA.
func runMode(ctx context.Context, o demoOptions, f *demoFleet, start time.Time, stderr io.Writer) (modeResult, error) {
	spec := fleetSpec{
		Mode:    f.mode,
		OTA:     f.url,
		Workers: o.workers,
		Start:   start,
		Until:   start.Add(o.duration),
		Share:   o.share,
		Rate:    o.rate,
		Redis:   o.redis,
		Prefix:  fmt.Sprintf("fleetrate:demo:%d:%d:%s:", os.Getpid(), start.UnixNano(), f.mode),
	}
	if f.mode == modeAdaptive {
		spec.status = o.status
	}
	var report fleetReport
	var err error
	if o.processes == 1 {
		report, err = runFleet(ctx, spec)
	} else {
		report, err = runChildren(ctx, spec, o.processes, stderr)
	}
	if err != nil {
		return modeResult{}, fmt.Errorf("%s fleet: %w", f.mode, err)
	}
	cfg := demoOTA()
	return modeResult{
		mode:       f.mode,
		duration:   o.duration,
		endpoints:  f.ota.Endpoints(),
		credential: cfg.Credential,
		stats:      f.ota.Stats(),
		credPeak:   f.ota.CredentialPeak(),
		report:     report,
	}, nil
}

// isTerminal reports whether w is a terminal, where a line can be redrawn.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// showProgress shows the OTAs' counts on w until the returned stop is
// called: a line redrawn five times a second on a terminal, else one line
// per second.
func showProgress(w io.Writer, start, until time.Time, fleets []*demoFleet) (stop func()) {
	every, lead, end := time.Second, "", "\n"
	if isTerminal(w) {
		every, lead, end = 200*time.Millisecond, "\r", ""
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	line := func() string {
		el := min(max(time.Since(start), 0), until.Sub(start))
		var b strings.Builder
		fmt.Fprintf(&b, "%s%4.1fs / %.1fs", lead, el.Seconds(), until.Sub(start).Seconds())
		for _, f := range fleets {
			var ok, limited int
			for _, s := range f.ota.Stats() {
				ok += s.Accepted
				limited += s.Limited()
			}
			fmt.Fprintf(&b, "  %s ok %d 429 %d", f.mode, ok, limited)
		}
		return b.String()
	}
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		last := ""
		for {
			select {
			case <-done:
				if l := line(); l != last || end == "" {
					fmt.Fprintf(w, "%s\n", l) // unless the last tick printed it
				}
				return
			case <-tick.C:
				last = line()
				fmt.Fprint(w, last+end)
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

// runChildren spreads spec.Workers over n copies of this binary, running
// the hidden "demo worker" command, and merges their reports.
func runChildren(ctx context.Context, spec fleetSpec, n int, stderr io.Writer) (fleetReport, error) {
	exe, err := os.Executable()
	if err != nil {
		return fleetReport{}, fmt.Errorf("finding this program to start workers: %w", err)
	}
	type child struct {
		cmd *exec.Cmd
		out bytes.Buffer
	}
	children := make([]*child, 0, n)
	first := 0
	for i := range n {
		k := spec.Workers / n
		if i < spec.Workers%n {
			k++
		}
		c := &child{}
		c.cmd = exec.CommandContext(ctx, exe, "demo", "worker",
			"--mode", spec.Mode,
			"--ota", spec.OTA,
			"--workers", strconv.Itoa(k),
			"--first", strconv.Itoa(first),
			"--start", spec.Start.Format(time.RFC3339Nano),
			"--until", spec.Until.Format(time.RFC3339Nano),
			"--share", strconv.FormatFloat(spec.Share, 'g', -1, 64),
			"--rate", strconv.FormatFloat(spec.Rate, 'g', -1, 64),
			"--redis", spec.Redis,
			"--prefix", spec.Prefix,
		)
		c.cmd.Env = append(os.Environ(), demoChildEnv+"=1")
		c.cmd.Stdout = &c.out
		c.cmd.Stderr = stderr
		c.cmd.WaitDelay = 5 * time.Second
		if err := c.cmd.Start(); err != nil {
			for _, started := range children {
				_ = started.cmd.Process.Kill()
				_ = started.cmd.Wait()
			}
			return fleetReport{}, fmt.Errorf("starting worker process %d: %w", i, err)
		}
		children = append(children, c)
		first += k
	}
	var report fleetReport
	var errs []error
	for i, c := range children {
		if err := c.cmd.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("worker process %d: %w", i, err))
			continue
		}
		var r fleetReport
		if err := json.Unmarshal(c.out.Bytes(), &r); err != nil {
			errs = append(errs, fmt.Errorf("worker process %d: reading its report: %w", i, err))
			continue
		}
		report.merge(r)
	}
	return report, errors.Join(errs...)
}
