package main

import (
	"fmt"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writeChart draws Redis decisions per second, as a multiple of the
// pipelined ceiling, for each implementation and goroutine count.
func writeChart(path string, rows []redisRow) error {
	p := plot.New()
	p.Title.Text = "Redis Allow: decisions/s as a multiple of the redis-benchmark ceiling"
	p.Y.Label.Text = "× ceiling (same run)"
	var impls []string
	var gs []int
	for _, r := range rows {
		if !contains(impls, r.impl) {
			impls = append(impls, r.impl)
		}
		if !contains(gs, r.g) {
			gs = append(gs, r.g)
		}
	}
	var labels []string
	for _, hot := range []bool{true, false} {
		for _, g := range gs {
			k := "10k keys"
			if hot {
				k = "hot key"
			}
			labels = append(labels, k+", g="+strconv.Itoa(g))
		}
	}
	w := vg.Points(8)
	for i, impl := range impls {
		var vals plotter.Values
		for _, hot := range []bool{true, false} {
			for _, g := range gs {
				for _, r := range rows {
					if r.impl == impl && r.hot == hot && r.g == g {
						vals = append(vals, r.m.ops/r.ceiling)
					}
				}
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		bars.Offset = w * vg.Length(i-len(impls)/2)
		bars.Color = plotColor(i)
		bars.LineStyle.Width = 0
		p.Add(bars)
		p.Legend.Add(impl, bars)
	}
	p.Legend.Top = true
	p.NominalX(labels...)
	return p.Save(11*vg.Inch, 5*vg.Inch, path)
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
