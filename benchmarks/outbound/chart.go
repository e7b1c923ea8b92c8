package outbound

import (
	"fmt"
	"image/color"
	"io"
	"net/http"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/fleetrate/fleetrate/internal/cli/mockota"
)

// Series is one scenario's arrivals, second by second, for a chart.
type Series struct {
	Name     string
	Accepted []float64 // accepted requests in each second of the run
	Limited  []float64 // 429s in each second
	Target   float64
}

// String lists the series second by second as accepted/limited.
func (s Series) String() string {
	var b strings.Builder
	for i := range s.Accepted {
		fmt.Fprintf(&b, " %g/%g", s.Accepted[i], s.Limited[i])
	}
	return b.String()
}

// series bins arrivals between from and to into seconds.
func series(name string, target float64, arrivals []mockota.AdversaryArrival, from, to time.Time) Series {
	n := int(to.Sub(from) / time.Second)
	s := Series{Name: name, Target: target, Accepted: make([]float64, n), Limited: make([]float64, n)}
	for _, a := range arrivals {
		i := int(a.At.Sub(from) / time.Second)
		if a.At.Before(from) || i >= n {
			continue
		}
		if a.Status == http.StatusOK {
			s.Accepted[i]++
		} else {
			s.Limited[i]++
		}
	}
	return s
}

// WriteChart draws, one panel per series, the requests the upstream
// accepted each second against its target, and its 429s: how the fleet's
// adaptive pacing converges on a hidden limit and stays there.
func WriteChart(w io.Writer, ss []Series) error {
	var panels [][]*plot.Plot
	for _, s := range ss {
		p := plot.New()
		p.Title.Text = s.Name
		p.X.Label.Text = "seconds into the run"
		p.Y.Label.Text = "requests per second"
		acc, lim, tgt := make(plotter.XYs, len(s.Accepted)), make(plotter.XYs, len(s.Limited)), plotter.XYs{{X: 0, Y: s.Target}, {X: float64(len(s.Accepted)), Y: s.Target}}
		for i := range s.Accepted {
			acc[i] = plotter.XY{X: float64(i), Y: s.Accepted[i]}
			lim[i] = plotter.XY{X: float64(i), Y: s.Limited[i]}
		}
		la, err := plotter.NewLine(acc)
		if err != nil {
			return err
		}
		la.Color, la.Width = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, vg.Points(1.5)
		ll, err := plotter.NewLine(lim)
		if err != nil {
			return err
		}
		ll.Color = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
		lt, err := plotter.NewLine(tgt)
		if err != nil {
			return err
		}
		lt.Dashes, lt.Color = []vg.Length{vg.Points(4), vg.Points(3)}, color.Gray{Y: 0x60}
		p.Add(la, ll, lt)
		p.Legend.Add("accepted", la)
		p.Legend.Add("answered 429", ll)
		p.Legend.Add(fmt.Sprintf("target %g/s", s.Target), lt)
		p.Legend.Top = true
		p.Y.Min = 0
		panels = append(panels, []*plot.Plot{p})
	}
	const width = 24 * vg.Centimeter
	height := vg.Length(len(panels)) * 7 * vg.Centimeter
	canvas := vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(100))}
	dc := draw.New(canvas)
	dc.SetColor(color.White)
	var bg vg.Path
	bg.Move(vg.Point{})
	bg.Line(vg.Point{X: width})
	bg.Line(vg.Point{X: width, Y: height})
	bg.Line(vg.Point{Y: height})
	bg.Close()
	dc.Fill(bg)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Millimeter * 3, PadBottom: vg.Millimeter * 3, PadX: vg.Millimeter * 3, PadY: vg.Millimeter * 5}
	canvases := plot.Align(panels, tiles, dc)
	for i, row := range panels {
		row[0].Draw(canvases[i][0])
	}
	_, err := canvas.WriteTo(w)
	return err
}
