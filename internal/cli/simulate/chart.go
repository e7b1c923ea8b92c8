package simulate

import (
	"fmt"
	"image/color"
	"io"
	"strings"

	xfont "golang.org/x/image/font"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart colours: a red and a blue that stay apart for colour-blind
// readers.
var (
	fixedColor  = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	bucketColor = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
)

// WriteChart draws admitted requests per second over time for both
// limiters, all clients in the top panel and the boundary client alone in
// the bottom one (when there is one), as "svg" or "png".
func (r *Report) WriteChart(w io.Writer, format string) error {
	format = strings.ToLower(format)
	if format != "svg" && format != "png" {
		return fmt.Errorf("simulate: chart format must be svg or png, got %q", format)
	}
	panels, err := r.panels()
	if err != nil {
		return err
	}
	c := r.Config
	return drawChart(w, format, panels,
		fmt.Sprintf("Admitted requests per second: fixed window of %d per %s vs token bucket of %g/s, burst %d", c.Quota, Per(c.Window), c.Rate, c.Burst))
}

// drawChart draws panels one above the other under a headline, as "svg"
// or "png".
func drawChart(w io.Writer, format string, panels [][]*plot.Plot, headline string) error {
	const width = 24 * vg.Centimeter
	height := vg.Length(len(panels)) * 9 * vg.Centimeter
	var canvas vg.CanvasWriterTo
	if format == "svg" {
		canvas = vgsvg.NewWith(vgsvg.UseWH(width, height), vgsvg.EmbedFonts(false))
	} else {
		canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))}
	}
	dc := draw.New(canvas)
	fillWhite(dc, width, height) // so the chart reads on dark pages too

	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Centimeter, PadBottom: vg.Millimeter * 3, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 6}
	canvases := plot.Align(panels, tiles, dc)
	for i, row := range panels {
		row[0].Draw(canvases[i][0])
	}

	// The headline across the top.
	sty := draw.TextStyle{
		Color:   color.Black,
		Font:    sansFont(13, "Bold"),
		XAlign:  draw.XCenter,
		YAlign:  draw.YTop,
		Handler: plot.DefaultTextHandler,
	}
	dc.FillText(sty, vg.Point{X: width / 2, Y: height - 3*vg.Millimeter}, headline)
	_, err := canvas.WriteTo(w)
	return err
}

// panels are the chart's rows: all clients, then the boundary client alone
// when there is one.
func (r *Report) panels() ([][]*plot.Plot, error) {
	c := r.Config
	top, err := r.panel("All clients: "+r.trafficTitle(), r.Fixed.PerSecond, r.Bucket.PerSecond)
	if err != nil {
		return nil, err
	}
	panels := [][]*plot.Plot{{top}}
	if c.Boundary >= 0 {
		bottom, err := r.panel(
			fmt.Sprintf("Boundary client: %d requests just before and %d just after %s", c.Quota, c.Quota, Start.Add(c.Boundary).Format("15:04:05")),
			r.Fixed.BoundaryPerSecond, r.Bucket.BoundaryPerSecond)
		if err != nil {
			return nil, err
		}
		panels = append(panels, []*plot.Plot{bottom})
	}
	return panels, nil
}

// trafficTitle names the simulated traffic, for the top panel's title.
func (r *Report) trafficTitle() string {
	c := r.Config
	var traffic []string
	if c.CronClients > 0 {
		traffic = append(traffic, fmt.Sprintf("%d cron clients firing %d requests at every :00", c.CronClients, c.CronBatch))
	}
	if c.Boundary >= 0 {
		traffic = append(traffic, "the boundary client")
	}
	if len(traffic) == 0 {
		return "no traffic"
	}
	return strings.Join(traffic, ", plus ")
}

// fillWhite paints the whole width × height canvas white.
func fillWhite(dc draw.Canvas, width, height vg.Length) {
	var bg vg.Path
	bg.Move(vg.Point{})
	bg.Line(vg.Point{X: width})
	bg.Line(vg.Point{X: width, Y: height})
	bg.Line(vg.Point{Y: height})
	bg.Close()
	dc.SetColor(color.White)
	dc.Fill(bg)
}

func sansFont(size vg.Length, weight string) font.Font {
	f := font.Font{Typeface: "Liberation", Variant: "Sans", Size: size}
	if weight == "Bold" {
		f.Weight = xfont.WeightBold
	}
	return f
}

// panel builds one plot with a step line per limiter.
func (r *Report) panel(title string, fixed, bucket []int) (*plot.Plot, error) {
	p := newPlot(title, "seconds since "+Start.Format("15:04:05"), "admitted / s")
	p.X.Min = 0
	p.X.Max = float64(len(fixed))
	p.X.Tick.Marker = minuteTicks{}
	p.Add(plotter.NewGrid())
	for _, s := range []struct {
		name  string
		data  []int
		color color.Color
		width vg.Length
		stats Stats
	}{
		{"fixed window", fixed, fixedColor, 1.4, r.Fixed},
		{"token bucket", bucket, bucketColor, 1.4, r.Bucket},
	} {
		pts := make(plotter.XYs, len(s.data)+1)
		for i, n := range s.data {
			pts[i] = plotter.XY{X: float64(i), Y: float64(n)}
		}
		pts[len(s.data)] = plotter.XY{X: float64(len(s.data)), Y: 0}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("simulate: chart: %w", err)
		}
		l.StepStyle = plotter.PostStep
		l.Color = s.color
		l.Width = vg.Points(float64(s.width))
		p.Add(l)
		p.Legend.Add(s.name, l)
	}
	return p, nil
}

// newPlot returns an empty plot in the chart's fonts, its legend at the
// top right and its y axis from 0.
func newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font = sansFont(10, "")
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	for _, ax := range []*plot.Axis{&p.X, &p.Y} {
		ax.Label.TextStyle.Font = sansFont(9, "")
		ax.Tick.Label.Font = sansFont(8, "")
	}
	p.Legend.TextStyle.Font = sansFont(9, "")
	p.Legend.Top = true
	p.Legend.XOffs = -2 * vg.Millimeter
	p.Y.Min = 0
	return p
}

// minuteTicks labels every 10 s and marks the minute boundaries.
type minuteTicks struct{}

// Ticks implements plot.Ticker.
func (minuteTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for s := 0; float64(s) <= hi; s += 10 {
		if float64(s) < lo {
			continue
		}
		label := ""
		if s%30 == 0 {
			label = fmt.Sprint(s)
		}
		ts = append(ts, plot.Tick{Value: float64(s), Label: label})
	}
	return ts
}
