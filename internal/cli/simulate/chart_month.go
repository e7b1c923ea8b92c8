package simulate

import (
	"fmt"
	"image/color"
	"io"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// monthStyles draw the four limiters, in the order of MonthReport.Limiters:
// a wide line under narrower ones and dashes, so that lines that coincide
// (as the fixed window and the quota alone do) all show.
var monthStyles = []struct {
	color  color.Color
	width  vg.Length
	dashes []vg.Length
}{
	{bucketColor, 3, nil},
	{fixedColor, 1.4, nil},
	{color.Black, 1.2, []vg.Length{vg.Points(5), vg.Points(3)}},
	{color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, 1.2, []vg.Length{vg.Points(1), vg.Points(3)}},
}

// WriteChart draws the month as "svg" or "png": the heavy customer's
// admitted requests per day, the boundary customer's per minute around the
// boundary, and the steady customer's per hour over the first week.
func (r *MonthReport) WriteChart(w io.Writer, format string) error {
	format = strings.ToLower(format)
	if format != "svg" && format != "png" {
		return fmt.Errorf("simulate: chart format must be svg or png, got %q", format)
	}
	c := r.Config
	from := r.From.Format("Jan 2")
	heavy, boundary, steady := r.CustomerIndex(Heavy), r.CustomerIndex(Boundary), r.CustomerIndex(Steady)
	span := 3 * c.BoundarySpan
	panels := []struct {
		title, x, y string
		bin         time.Duration
		lo, n       time.Duration // offset from From and length of the panel
		customer    int
	}{
		{fmt.Sprintf("Heavy customer: admitted per day (the quota resets at day %d)", r.day(r.Boundary)), "days since " + from, "admitted / day",
			24 * time.Hour, 0, r.End.Sub(r.From), heavy},
		{fmt.Sprintf("Boundary customer: admitted per minute, %d before and %d after %s", c.Quota, c.Quota, r.Boundary.Format("Jan 2 15:04 MST")),
			"minutes since " + r.Boundary.Add(-span).Format("Jan 2 15:04"), "admitted / min",
			time.Minute, r.Boundary.Add(-span).Sub(r.From), 2 * span, boundary},
		{"Steady customer: admitted per hour, the first week (all four agree)", "hours since " + from, "admitted / h",
			time.Hour, 0, 7 * 24 * time.Hour, steady},
	}
	var rows [][]*plot.Plot
	for _, pn := range panels {
		p := newPlot(pn.title, pn.x, pn.y)
		p.X.Min, p.X.Max = 0, float64(pn.n/pn.bin)
		p.Add(plotter.NewGrid())
		for i, l := range r.Limiters {
			line, err := binnedLine(l.Customers[pn.customer].Admits, pn.lo, pn.n, pn.bin)
			if err != nil {
				return fmt.Errorf("simulate: chart: %w", err)
			}
			st := monthStyles[i]
			line.Color, line.Width, line.Dashes = st.color, vg.Points(float64(st.width)), st.dashes
			p.Add(line)
			p.Legend.Add(l.Name, line)
		}
		p.Y.Max *= 1.3 // headroom for the legend above the lines
		rows = append(rows, []*plot.Plot{p})
	}
	return drawChart(w, format, rows, fmt.Sprintf("A month: quota %d/%s + bucket %s, burst %d; fixed window; bare bucket; quota alone",
		c.Quota, c.Period, perMinute(c.Rate), c.Burst))
}

// binnedLine is a step line of the times in [lo, lo+n) counted in bins of
// length bin, its x the bin's index.
func binnedLine(times []time.Duration, lo, n, bin time.Duration) (*plotter.Line, error) {
	counts := make([]int, n/bin)
	for _, t := range times {
		if t >= lo && t < lo+n {
			counts[(t-lo)/bin]++
		}
	}
	pts := make(plotter.XYs, len(counts)+1)
	for i, k := range counts {
		pts[i] = plotter.XY{X: float64(i), Y: float64(k)}
	}
	pts[len(counts)] = plotter.XY{X: float64(len(counts))}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.StepStyle = plotter.PostStep
	return l, nil
}
