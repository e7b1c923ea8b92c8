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
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrate/fleetrate/internal/mockota"
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
		return fmt.Errorf("--duration must be between 0 and %v, got %v", maxDemoDuration, o.duration)
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
	if err := demoUpstream(mockota.Demo(), o.share).Validate(); err != nil {
		return fmt.Errorf("--share %v: %w", o.share, err)
	}
	return nil
}

// newDemoCmd returns the "demo" command: the README's first command.
func newDemoCmd() *cobra.Command {
	o := demoOptions{duration: 3 * time.Second, workers: 6, processes: 1, rate: 10, share: 0.9, progress: true}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a fleet against a mock OTA, first with per-worker buckets, then with shared ones",
		Long: `Demo starts a mock OTA on a loopback port. The OTA documents a limit per
endpoint (availability 20/s, rates 5/s, reservations 10/s) and one for the
whole credential (30/s), enforces them exactly over a sliding 1-second
window, and also enforces a hidden limit (2 rate updates per second per
hotel). It answers 429 with Retry-After.

The same fleet then runs twice:
  naive   each worker paces itself with its own local bucket (--rate, 10/s);
  shared  all workers share fleetrate buckets at --share (90 %) of each
          documented limit, and a 429 pauses the endpoint for the whole fleet.

Each run prints requests, 429s, the achieved rate against each documented
limit and the p50/p99 wait. The command fails if the shared run broke a
documented limit. By default the store is in memory and the workers are
goroutines; --redis shares a Redis store, and --processes spreads the
workers over that many OS processes.`,
		Example: `  fleetrate demo
  fleetrate demo --duration 10s
  fleetrate demo --redis redis://127.0.0.1:6379/0 --processes 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.duration, "duration", o.duration, "how long each of the two runs lasts")
	f.IntVar(&o.workers, "workers", o.workers, "workers in the fleet")
	f.IntVar(&o.processes, "processes", o.processes, "OS processes to spread the workers over (needs --redis when above 1)")
	f.Float64Var(&o.rate, "rate", o.rate, "naive run: requests per second each worker allows itself")
	f.Float64Var(&o.share, "share", o.share, "shared run: fraction of each documented limit to pace at")
	f.StringVar(&o.redis, "redis", "", "Redis URL for the shared store, e.g. redis://127.0.0.1:6379/0 (default: in memory)")
	f.BoolVar(&o.progress, "progress", o.progress, "show a live progress line on stderr")
	f.StringVar(&o.statusAddr, "status-addr", "127.0.0.1:0", "where the live status page of the shared run listens (in-process fleets only); \"off\" disables it")
	cmd.AddCommand(newDemoWorkerCmd())
	return cmd
}

// modeResult is one run's outcome: the OTA's counts and the fleet's report.
type modeResult struct {
	mode       string
	about      string
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

func runDemo(ctx context.Context, o demoOptions, stdout, stderr io.Writer) error {
	if err := o.validate(); err != nil {
		return err
	}
	if !isTerminal(stderr) {
		stderr = &lockedWriter{w: stderr}
	}
	cfg := mockota.Demo()
	ota, err := mockota.New(cfg)
	if err != nil {
		return err
	}
	where := "goroutines"
	if o.processes > 1 {
		where = fmt.Sprintf("%d processes", o.processes)
	}
	store := "the in-memory store"
	if o.redis != "" {
		store = "Redis at " + o.redis
	}
	fmt.Fprintf(stdout, "fleetrate demo: %d workers (%s) against a mock OTA for %v per run\n", o.workers, where, o.duration)
	fmt.Fprintf(stdout, "documented limits: %s (sliding 1 s window)\n", ota.Describe())
	fmt.Fprintf(stdout, "hidden limit: %s %d/s per hotel\n", cfg.Hidden.Endpoint, cfg.Hidden.Limit)
	if o.statusAddr != "off" && o.processes == 1 {
		if o.status, err = startDemoStatus(o.statusAddr, o.share); err != nil {
			return err
		}
		defer o.status.close()
		o.status.printAddr(stdout)
	}
	fmt.Fprintln(stdout)

	runs := []struct{ mode, about string }{
		{modeNaive, fmt.Sprintf("each worker has its own local %g/s bucket", o.rate)},
		{modeShared, fmt.Sprintf("all workers share buckets at %g%% of each documented limit, in %s", o.share*100, store)},
	}
	var shared modeResult
	for _, run := range runs {
		res, err := runMode(ctx, o, run.mode, stderr)
		if err != nil {
			return fmt.Errorf("%s run: %w", run.mode, err)
		}
		res.about = run.about
		printResult(stdout, res)
		if run.mode == modeShared {
			shared = res
		}
	}
	return sharedVerdict(shared)
}

// sharedVerdict fails the demo when the shared run drew a 429 from a
// documented limit: fleetrate's promise is that it never does.
func sharedVerdict(shared modeResult) error {
	var broken []string
	for _, e := range shared.endpoints {
		if n := shared.stats[e.Name].Documented; n > 0 {
			broken = append(broken, fmt.Sprintf("%s %d", e.Name, n))
		}
	}
	if len(broken) > 0 {
		return fmt.Errorf("the shared run broke a documented limit: the OTA answered 429 for documented limits (%s)", strings.Join(broken, ", "))
	}
	return nil
}

// runMode runs the fleet once in the given mode against a fresh mock OTA.
func runMode(ctx context.Context, o demoOptions, mode string, stderr io.Writer) (modeResult, error) {
	cfg := mockota.Demo()
	ota, err := mockota.New(cfg)
	if err != nil {
		return modeResult{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return modeResult{}, fmt.Errorf("starting the mock OTA: %w", err)
	}
	srv := &http.Server{Handler: ota, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	lead := 20 * time.Millisecond
	if o.processes > 1 {
		lead = 1500 * time.Millisecond // time for the processes to start and connect
	}
	start := time.Now().Add(lead)
	spec := fleetSpec{
		status:  o.status,
		Mode:    mode,
		OTA:     "http://" + ln.Addr().String(),
		Workers: o.workers,
		Start:   start,
		Until:   start.Add(o.duration),
		Share:   o.share,
		Rate:    o.rate,
		Redis:   o.redis,
		Prefix:  fmt.Sprintf("fleetrate:demo:%d:%d:", os.Getpid(), start.UnixNano()),
	}

	stop := func() {}
	if o.progress {
		stop = showProgress(stderr, mode, spec.Start, spec.Until, ota)
	}
	var report fleetReport
	if o.processes == 1 {
		report, err = runFleet(ctx, spec)
	} else {
		report, err = runChildren(ctx, spec, o.processes, stderr)
	}
	stop()
	if err != nil {
		return modeResult{}, err
	}
	return modeResult{
		mode:       mode,
		duration:   o.duration,
		endpoints:  ota.Endpoints(),
		credential: cfg.Credential,
		stats:      ota.Stats(),
		credPeak:   ota.CredentialPeak(),
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

// showProgress shows the OTA's counts on w until the returned stop is
// called: a line redrawn five times a second on a terminal, else one line
// per second.
func showProgress(w io.Writer, mode string, start, until time.Time, ota *mockota.OTA) (stop func()) {
	every, lead, end := time.Second, "", "\n"
	if isTerminal(w) {
		every, lead, end = 200*time.Millisecond, "\r", ""
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	line := func() string {
		var sent, ok, limited int
		for _, s := range ota.Stats() {
			sent += s.Requests
			ok += s.Accepted
			limited += s.Limited()
		}
		el := min(max(time.Since(start), 0), until.Sub(start))
		return fmt.Sprintf("%s%-6s %5.1fs / %.1fs  sent %5d  ok %5d  429 %5d", lead, mode, el.Seconds(), until.Sub(start).Seconds(), sent, ok, limited)
	}
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				fmt.Fprintf(w, "%s\n", line())
				return
			case <-tick.C:
				fmt.Fprint(w, line()+end)
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

// printResult prints one run's table.
func printResult(w io.Writer, r modeResult) {
	fmt.Fprintf(w, "%s: %s\n", r.mode, r.about)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "  limit\tdocumented\tsent\tok\t429 documented\t429 hidden\tsent/s\tok/s\tok/s of limit\tpeak in 1 s\t")
	secs := r.duration.Seconds()
	row := func(name string, limit int, s mockota.Stats, peak int) {
		fmt.Fprintf(tw, "  %s\t%d/s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.0f%%\t%d/%d\t\n", name, limit, s.Requests, s.Accepted, s.Documented, s.Hidden,
			float64(s.Requests)/secs, float64(s.Accepted)/secs, 100*float64(s.Accepted)/secs/float64(limit), peak, limit)
	}
	var total mockota.Stats
	for _, e := range r.endpoints {
		s := r.stats[e.Name]
		row(e.Name, e.Limit, s, s.Peak)
		total.Requests += s.Requests
		total.Accepted += s.Accepted
		total.Documented += s.Documented
		total.Hidden += s.Hidden
	}
	if r.credential > 0 {
		row("credential", r.credential, total, r.credPeak)
	}
	tw.Flush()

	p50, p99 := percentile(r.report.Waits, 50), percentile(r.report.Waits, 99)
	fmt.Fprintf(w, "  wait before sending: p50 %v, p99 %v (%d requests)\n", p50.Round(time.Millisecond), p99.Round(time.Millisecond), len(r.report.Waits))
	var outcomes []string
	for _, k := range []string{outcomeOK, outcomeLimited, outcomeGaveUp, outcomeBackpressure, outcomeCut, outcomeError} {
		if v := r.report.Outcomes[k]; v > 0 {
			outcomes = append(outcomes, fmt.Sprintf("%s %d", k, v))
		}
	}
	fmt.Fprintf(w, "  workers saw: %s\n", strings.Join(outcomes, ", "))
	if n := r.documented(); n > 0 {
		fmt.Fprintf(w, "  verdict: documented limits broken (%d 429s)\n\n", n)
	} else {
		fmt.Fprintf(w, "  verdict: no documented limit broken\n\n")
	}
}

// percentile returns the p-th percentile of ds (nearest rank), 0 when
// empty.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(float64(p) / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}
