package simulate

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// dayFormat and minuteFormat print the run's dates in the period's zone.
const (
	dayFormat    = "Mon 2006-01-02"
	minuteFormat = "Mon 2006-01-02 15:04 MST"
)

// BucketBound returns the most requests the smoothing bucket can admit to
// one customer in any span of length d: Burst + Rate × d.
func (c MonthConfig) BucketBound(d time.Duration) float64 {
	c = c.withDefaults()
	return float64(c.Burst) + c.Rate*d.Seconds()
}

// short formats a duration without its zero tail: "10m", "1h30m", "45s".
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// perMinute formats a rate a second as a count a minute.
func perMinute(rate float64) string { return fmt.Sprintf("%g/min", rate*60) }

// WriteTable prints the report: the traffic and limiters, admitted per
// day, and each customer's figures under each limiter.
func (r *MonthReport) WriteTable(w io.Writer) error {
	r.writeHeader(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	cells := []string{"admitted per day (refused), all customers"}
	for _, l := range r.Limiters {
		cells = append(cells, l.Name)
	}
	row(tw, cells)
	for d := range r.Config.Days {
		cells = []string{r.DayStart(d).Format(dayFormat)}
		if start := r.DayStart(d); !r.Boundary.Before(start) && r.Boundary.Before(r.DayStart(d+1)) {
			cells[0] += "  <- boundary"
		}
		for _, l := range r.Limiters {
			cell := fmt.Sprint(l.PerDay[d])
			if n := l.DeniedPerDay[d]; n > 0 {
				cell += fmt.Sprintf(" (%d)", n)
			}
			cells = append(cells, cell)
		}
		row(tw, cells)
	}
	row(tw, nil)
	r.writeSummary(tw)
	if err := tw.Flush(); err != nil {
		return err
	}
	return r.writeFindings(w)
}

// writeHeader describes the run, its traffic and its limiters.
func (r *MonthReport) writeHeader(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "Simulated %d days, %s to %s, centred on the quota's window start %s.\n",
		c.Days, r.From.Format(minuteFormat), r.End.Format(minuteFormat), r.Boundary.Format(minuteFormat))
	fmt.Fprintln(w, "Each customer is its own key, sending from 07:00 to 21:00 in the zone with a morning peak; a refused request is not retried.")
	for _, cu := range r.Customers {
		fmt.Fprintf(w, "  %-9s %d a weekday, %d a weekend day: %s\n", cu.Name, cu.Weekday, cu.Weekend, cu.About)
	}
	fmt.Fprintln(w, "Limiters (fleetrate's on the memstore, on the simulated clock):")
	fmt.Fprintf(w, "  quota+bucket  calendar quota %d/%s + token bucket %s, burst %d\n", c.Quota, c.Period, perMinute(c.Rate), c.Burst)
	fmt.Fprintf(w, "  fixed window  %d per window of %s, no smoothing (a counter in the simulator, not a fleetrate feature)\n", c.Quota, c.Period)
	fmt.Fprintf(w, "  bare bucket   token bucket %d per 30 days (%.1f a day), burst %d: a continuous refill\n", c.Quota, float64(c.Quota)/30, c.BareBurst)
	fmt.Fprintf(w, "  quota alone   calendar quota %d/%s\n\n", c.Quota, c.Period)
}

// writeSummary prints each customer's figures, one row each, a column per
// limiter.
func (r *MonthReport) writeSummary(tw io.Writer) {
	week := r.Boundary.Add(7 * 24 * time.Hour).Sub(r.From)
	rows := []struct {
		label string
		f     func(CustomerStats) string
	}{
		{"admitted", func(s CustomerStats) string { return fmt.Sprint(len(s.Admits)) }},
		{"most admitted in any minute", func(s CustomerStats) string { return fmt.Sprint(s.MaxInMinute) }},
		{"admitted in the 24 h around the boundary", func(s CustomerStats) string { return fmt.Sprint(s.AroundBoundary) }},
		{"admitted in the 7 days from the boundary", func(s CustomerStats) string {
			return fmt.Sprint(countIn(s.Admits, r.Boundary.Sub(r.From), week))
		}},
		{"denied (by a quota or window)", func(s CustomerStats) string { return fmt.Sprintf("%d (%d)", len(s.Denials), s.QuotaDenied) }},
		{"first refused", func(s CustomerStats) string {
			if len(s.Denials) == 0 {
				return "-"
			}
			return r.From.Add(s.Denials[0]).Format("Mon 01-02 15:04")
		}},
	}
	for ci, cu := range r.Customers {
		for _, rw := range rows {
			cells := []string{cu.Name + ": " + rw.label}
			for _, l := range r.Limiters {
				cells = append(cells, rw.f(l.Customers[ci]))
			}
			row(tw, cells)
		}
	}
	cells := []string{"all: admitted / denied"}
	for _, l := range r.Limiters {
		cells = append(cells, fmt.Sprintf("%d / %d", l.Admitted(), l.Denied()))
	}
	row(tw, cells)
}

// row writes cells as one line of a tabwriter table, without trailing
// blanks.
func row(w io.Writer, cells []string) {
	fmt.Fprintln(w, strings.Join(cells, "\t"))
}

// countIn counts the sorted times in [lo, hi).
func countIn(times []time.Duration, lo, hi time.Duration) (n int) {
	for _, t := range times {
		if t >= lo && t < hi {
			n++
		}
	}
	return n
}

// firstOr returns the first of times, or d when there is none.
func firstOr(times []time.Duration, d time.Duration) time.Duration {
	if len(times) == 0 {
		return d
	}
	return times[0]
}

// writeFindings states what the figures show.
func (r *MonthReport) writeFindings(w io.Writer) error {
	c := r.Config
	b := r.CustomerIndex(Boundary)
	fw, qb := r.Limiters[FixedWindow].Customers[b], r.Limiters[QuotaBucket].Customers[b]
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nAcross the boundary the fixed window (and the quota alone) let the boundary customer through %.2fx the quota\n",
		float64(fw.AroundBoundary)/float64(c.Quota))
	fmt.Fprintf(&sb, "within %v; with the smoothing bucket, at most %d in any minute (the bound is burst + rate x 1 min = %.0f).\n",
		short(2*c.BoundarySpan), qb.MaxInMinute, c.BucketBound(time.Minute))
	h := r.Limiters[BareBucket].Customers[r.CustomerIndex(Heavy)]
	fmt.Fprintf(&sb, "The heavy customer spends its quota early: the quota refuses it until %s, then gives the month back whole;\n", r.Boundary.Format(minuteFormat))
	fmt.Fprintf(&sb, "the bare bucket refuses nothing until its burst and refill are spent (%d admitted by then), then trickles %.0f a day.\n",
		countIn(h.Admits, 0, firstOr(h.Denials, r.End.Sub(r.From))), float64(c.Quota)/30)
	_, err := io.WriteString(w, sb.String())
	return err
}
