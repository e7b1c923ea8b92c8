package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fleetrate/fleetrate/calendar"
	"github.com/fleetrate/fleetrate/internal/cli/simulate"
)

const simulateLong = `simulate (--scenario minute, the default) plays the same simulated seconds
of traffic through a fixed-window counter and through fleetrate's token
bucket (the real memstore on a simulated clock):

  - cron clients that each fire a batch at every :00 and retry refused
    requests after Retry-After;
  - a client that spends a whole window quota just before a window
    boundary and a whole quota again just after it.

It prints, for each limiter, the most requests admitted in any 20 s span,
the peak admitted per second and the rejections, and writes a chart of
admitted requests per second (SVG or PNG, by the --out extension).

--scenario month plays a month instead, on a simulated clock (nothing
sleeps; it takes well under a second): three customers, each its own key,
through four limiters side by side:

  quota+bucket  a calendar quota (--quota, default 10000, per --period,
                default "month day=1" in UTC) plus a smoothing token bucket
                (--rate, default 0.5/s = 30/min; --burst, default 30)
  fixed window  a bare counter reset at each window start of the period, no
                smoothing (in the simulator only, the baseline)
  bare bucket   a token bucket refilling the quota per 30 days, burst
                --bare-burst (default the quota): the continuous refill a
                plan is not
  quota alone   the calendar quota without the smoothing bucket

The traffic follows a working day (07:00-21:00 in the period's zone, a
morning peak, lighter weekends): a heavy customer spends the quota in about
ten working days, a steady one stays within it, and a boundary customer
sends a whole quota in the --boundary-span (default 10m) before the window
start in --month (default 2026-02) and a whole quota in the span after.
The run covers --days days (default 31) centred on that boundary. It prints
admitted per day, and per customer the most admitted in any minute, in the
24 h around the boundary and in the week after it, and the refusals; the
chart shows the heavy customer per day, the boundary customer per minute
and the steady customer per hour. For example:

  fleetrate simulate --scenario month --period "month day=1 Asia/Tokyo" -o month.svg`

// newSimulateCmd returns "fleetrate simulate": the same traffic through a
// fixed window and through the token bucket, with a chart.
func newSimulateCmd() *cobra.Command {
	var (
		cfg        simulate.Config
		month      monthFlags
		out        string
		noBoundary bool
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Compare a fixed-window counter with the token bucket on cron stampedes and window boundaries",
		Long:  simulateLong,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch month.scenario {
			case "minute":
				if err := onlyFlags(cmd, "minute", "period", "month", "days", "bare-burst"); err != nil {
					return err
				}
				return runSimulate(cmd.OutOrStdout(), cfg, out, noBoundary)
			case "month":
				if err := onlyFlags(cmd, "month", "duration", "window", "cron-clients", "cron-batch", "boundary", "no-boundary", "span"); err != nil {
					return err
				}
				return runMonth(cmd, month, cfg, out)
			}
			return fmt.Errorf("--scenario %q: want minute or month", month.scenario)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", filepath.Join(os.TempDir(), "fleetrate-simulate.png"), "chart file, .png or .svg (fonts not embedded); empty for none")
	f.DurationVar(&cfg.Duration, "duration", simulate.DefaultDuration, "simulated time from 12:00:00")
	f.DurationVar(&cfg.Window, "window", simulate.DefaultWindow, "fixed window length")
	f.Int64Var(&cfg.Quota, "quota", simulate.DefaultQuota, "fixed window quota per client and window; --scenario month: the calendar quota (default 10000)")
	f.Float64Var(&cfg.Rate, "rate", 0, "token bucket rate per second (default quota/window); --scenario month: the smoothing bucket's (default 0.5)")
	f.Int64Var(&cfg.Burst, "burst", simulate.DefaultBurst, "token bucket burst; --scenario month: the smoothing bucket's (default 30)")
	f.IntVar(&cfg.CronClients, "cron-clients", simulate.DefaultCronClients, "clients firing a batch at every :00 (0 for none)")
	f.IntVar(&cfg.CronBatch, "cron-batch", simulate.DefaultCronBatch, "requests per cron client per minute")
	f.DurationVar(&cfg.Boundary, "boundary", simulate.DefaultBoundary, "window boundary straddled by the boundary client, from 12:00:00")
	f.BoolVar(&noBoundary, "no-boundary", false, "leave out the boundary client")
	f.DurationVar(&cfg.BoundarySpan, "boundary-span", simulate.DefaultBoundarySpan, "how long before and after the boundary it sends each quota (--scenario month: default 10m)")
	f.DurationVar(&cfg.Span, "span", simulate.DefaultSpan, "sliding span for the most-admitted count")
	f.StringVar(&month.scenario, "scenario", "minute", `"minute" (cron stampedes and a window boundary, seconds) or "month" (calendar quotas, days)`)
	f.StringVar(&month.period, "period", simulate.DefaultMonthPeriod, `month scenario: the quota's calendar period, e.g. "month day=15 Europe/Paris"`)
	f.StringVar(&month.month, "month", simulate.DefaultMonth, "month scenario: the month (YYYY-MM) whose window start the run is centred on")
	f.IntVar(&month.days, "days", simulate.DefaultMonthDays, "month scenario: days simulated")
	f.Int64Var(&month.bareBurst, "bare-burst", 0, "month scenario: the bare bucket's burst (default the quota)")
	return cmd
}

// monthFlags are the flags of --scenario month beside those it shares.
type monthFlags struct {
	scenario, period, month string
	days                    int
	bareBurst               int64
}

// onlyFlags refuses, for the named scenario, any of the given flags set on
// the command line: they belong to the other scenario.
func onlyFlags(cmd *cobra.Command, scenario string, others ...string) error {
	for _, name := range others {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s does not apply to --scenario %s", name, scenario)
		}
	}
	return nil
}

// runMonth runs the month scenario and prints its report, then writes the
// chart unless out is empty. The flags it shares with the minute scenario
// (--quota, --rate, --burst, --boundary-span) keep the month's defaults
// unless set.
func runMonth(cmd *cobra.Command, m monthFlags, shared simulate.Config, out string) error {
	w := cmd.OutOrStdout()
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(out)), ".")
	if out != "" && format != "png" && format != "svg" {
		return fmt.Errorf("--out %q: the chart is written as .png or .svg", out)
	}
	period, err := calendar.Parse(m.period)
	if err != nil {
		return fmt.Errorf("--period %q: %w", m.period, err)
	}
	cfg := simulate.MonthConfig{Period: period, Month: m.month, Days: m.days, BareBurst: m.bareBurst}
	changed := cmd.Flags().Changed
	if changed("quota") {
		cfg.Quota = shared.Quota
	}
	if changed("rate") {
		cfg.Rate = shared.Rate
	}
	if changed("burst") {
		cfg.Burst = shared.Burst
	}
	if changed("boundary-span") {
		cfg.BoundarySpan = shared.BoundarySpan
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"quota", cfg.Quota}, {"burst", cfg.Burst}, {"days", int64(m.days)}, {"bare-burst", m.bareBurst}} {
		if changed(f.name) && f.v <= 0 {
			return fmt.Errorf("--%s must be above 0, got %d", f.name, f.v)
		}
	}
	if changed("rate") && !(cfg.Rate > 0) {
		return fmt.Errorf("--rate must be above 0, got %g", cfg.Rate)
	}
	if changed("boundary-span") && cfg.BoundarySpan <= 0 {
		return fmt.Errorf("--boundary-span must be above 0, got %v", cfg.BoundarySpan)
	}
	rep, err := simulate.RunMonth(cfg)
	if err != nil {
		return err
	}
	if err := rep.WriteTable(w); err != nil {
		return err
	}
	return writeChartFile(w, out, format, rep.WriteChart)
}

// writeChartFile writes the chart drawn by chart to the file out, unless
// out is empty, and says so on w.
func writeChartFile(w io.Writer, out, format string, chart func(io.Writer, string) error) error {
	if out == "" {
		return nil
	}
	var buf bytes.Buffer
	if err := chart(&buf, format); err != nil {
		return fmt.Errorf("--out %s: %w", out, err)
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nchart written to %s\n", out)
	return err
}

// runSimulate runs the simulation cfg and prints its report to w, then
// writes the chart to the file out unless out is empty.
func runSimulate(w io.Writer, cfg simulate.Config, out string, noBoundary bool) error {
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(out)), ".")
	if out != "" && format != "png" && format != "svg" {
		return fmt.Errorf("--out %q: the chart is written as .png or .svg", out)
	}
	if err := checkSimulateFlags(cfg); err != nil {
		return err
	}
	if cfg.CronClients == 0 {
		cfg.CronClients = -1 // the flag's 0 means none; the Config's means the default
	}
	if noBoundary {
		cfg.Boundary = -1
	}
	rep, err := simulate.Run(cfg)
	if err != nil {
		return err
	}
	if err := printReport(w, rep); err != nil {
		return err
	}
	return writeChartFile(w, out, format, rep.WriteChart)
}

// checkSimulateFlags refuses the zero values the flags cannot mean: a
// zero Config field means its default, which the flags show already, so
// a 0 given on the command line would be replaced silently.
func checkSimulateFlags(cfg simulate.Config) error {
	for _, f := range []struct {
		name string
		zero bool
	}{
		{"duration", cfg.Duration == 0}, {"window", cfg.Window == 0}, {"quota", cfg.Quota == 0},
		{"burst", cfg.Burst == 0}, {"cron-batch", cfg.CronBatch == 0}, {"boundary", cfg.Boundary == 0},
		{"boundary-span", cfg.BoundarySpan == 0}, {"span", cfg.Span == 0},
	} {
		if f.zero {
			return fmt.Errorf("--%s must be above 0, got 0", f.name)
		}
	}
	if cfg.CronClients < 0 {
		return fmt.Errorf("--cron-clients must be 0 (none) or more, got %d", cfg.CronClients)
	}
	return nil
}

func printReport(w io.Writer, r *simulate.Report) error {
	c := r.Config
	boundary := c.Boundary >= 0
	var traffic []string
	if c.CronClients > 0 {
		traffic = append(traffic, fmt.Sprintf("%d cron clients x %d requests at every :00", c.CronClients, c.CronBatch))
	}
	if boundary {
		traffic = append(traffic, fmt.Sprintf("one client sending %d requests in the %v before and the %v after %s",
			c.Quota, c.BoundarySpan, c.BoundarySpan, simulate.Start.Add(c.Boundary).Format("15:04:05")))
	}
	if len(traffic) == 0 {
		traffic = append(traffic, "no traffic")
	}
	fmt.Fprintf(w, "Simulated %v from 12:00:00: %s.\n", c.Duration, strings.Join(traffic, ", and "))
	fmt.Fprintf(w, "Fixed window: %d per client per %s. Token bucket: %g/s, burst %d (fleetrate, memstore on the simulated clock).\n\n",
		c.Quota, simulate.Per(c.Window), c.Rate, c.Burst)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	span := c.Span.String()
	type row struct {
		label string
		f     func(simulate.Stats) string
	}
	var rows []row
	if boundary {
		rows = append(rows, row{"boundary client: most admitted in any " + span, func(s simulate.Stats) string { return fmt.Sprint(s.BoundaryMaxInSpan) }})
	}
	rows = append(rows,
		row{"all clients: most admitted in any " + span, func(s simulate.Stats) string { return fmt.Sprint(s.MaxInSpan) }},
		row{"all clients: peak admitted per second", func(s simulate.Stats) string {
			return fmt.Sprintf("%d (at %s)", s.PeakPerSecond, simulate.Start.Add(time.Duration(s.PeakSecond)*time.Second).Format("15:04:05"))
		}},
		row{"rejections (429)", func(s simulate.Stats) string { return fmt.Sprint(s.Rejected) }},
		row{"admitted", func(s simulate.Stats) string { return fmt.Sprint(s.Admitted) }},
	)
	fmt.Fprintf(tw, "\t%s\t%s\t\n", r.Fixed.Name, r.Bucket.Name)
	for _, row := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", row.label, row.f(r.Fixed), row.f(r.Bucket))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	switch {
	case c.CronClients > 0 && boundary:
		fmt.Fprintln(w, "\nThe bucket refuses the boundary client's excess and, for a while, the cron stampede: those cron")
		fmt.Fprintln(w, "requests come back after Retry-After and are admitted over the following seconds.")
	case c.CronClients > 0:
		fmt.Fprintln(w, "\nThe bucket's rejections are cron requests that come back after Retry-After and are admitted")
		fmt.Fprintln(w, "over the following seconds.")
	}
	if !boundary {
		return nil
	}
	_, err := fmt.Fprintf(w, "A fixed window let one client through %.1fx its quota within %v; a token bucket never lets through more than burst + rate x %v = %.0f.\n",
		float64(r.Fixed.BoundaryMaxInSpan)/float64(c.Quota), c.Span, c.Span, c.BucketBound(c.Span))
	return err
}
