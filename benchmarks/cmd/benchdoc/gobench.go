package main

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Result is one line of `go test -bench` output: the benchmark's name
// (without the -GOMAXPROCS suffix) and its metrics by unit.
type Result struct {
	Name    string
	Metrics map[string]float64
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// ParseBench returns the result lines of `go test -bench` output, in order.
// A line is a result when it starts with "Benchmark", its second field is
// the iteration count and the rest are value-unit pairs; other lines (logs,
// PASS, ok) are ignored, as are malformed ones.
func ParseBench(out string) []Result {
	var rs []Result
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
			continue
		}
		r := Result{Name: procSuffix.ReplaceAllString(f[0], ""), Metrics: map[string]float64{}}
		ok := true
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				ok = false
				break
			}
			r.Metrics[f[i+1]] = v
		}
		if ok {
			rs = append(rs, r)
		}
	}
	return rs
}

// values returns the unit's values over the results named name, in order.
func values(rs []Result, name, unit string) []float64 {
	var vs []float64
	for _, r := range rs {
		if v, ok := r.Metrics[unit]; ok && r.Name == name {
			vs = append(vs, v)
		}
	}
	return vs
}

// GoBenchTable formats the results of one of the `go test -bench` runs of
// docs/BENCHMARKS.md as the table the file shows for it.
func GoBenchTable(table string, rs []Result) (string, error) {
	if len(rs) == 0 {
		return "", fmt.Errorf("gobench: the input holds no benchmark result")
	}
	switch table {
	case "memstore":
		return memstoreTable(rs)
	case "overlimit":
		return overlimitTable(rs)
	case "statuspage":
		return statuspageTable(rs)
	}
	return "", fmt.Errorf("gobench -table: unknown table %q (want memstore, overlimit or statuspage)", table)
}

// memstoreTable: BenchmarkNewKeysCapRatio's ns per new key at the cap and
// below it (ranges over the runs) and their ratio (median and range).
func memstoreTable(rs []Result) (string, error) {
	const name = "BenchmarkNewKeysCapRatio"
	at, below, ratio := values(rs, name, "atcap-ns/take"), values(rs, name, "below-ns/take"), values(rs, name, "ratio")
	if len(at) == 0 || len(below) == 0 || len(ratio) == 0 {
		return "", fmt.Errorf("gobench: no %s result with atcap-ns/take, below-ns/take and ratio", name)
	}
	lo, hi := minMax(ratio)
	return fmt.Sprintf("| memstore | at cap, ns per new key | below cap | ratio (median, range) |\n|---|---|---|---|\n"+
		"| two victims per sample | %s | %s | %.2f (%.2f–%.2f) |\n", span(at), span(below), median(ratio), lo, hi), nil
}

// overlimitTable: BenchmarkRLSHotOverLimit's decisions/s (range over the
// runs) and store calls per decision, per store and cache setting.
func overlimitTable(rs []Result) (string, error) {
	var b strings.Builder
	b.WriteString("| store | cache | decisions/s | store calls per decision |\n|---|---|---|---|\n")
	rows := 0
	for _, st := range []string{"redis", "memory"} {
		off := values(rs, "BenchmarkRLSHotOverLimit/"+st+"/cache=off", "decisions/s")
		for _, cache := range []string{"off", "on"} {
			name := "BenchmarkRLSHotOverLimit/" + st + "/cache=" + cache
			ds, calls := values(rs, name, "decisions/s"), values(rs, name, "store-calls/decision")
			if len(ds) == 0 || len(calls) == 0 {
				continue
			}
			label := map[string]string{"redis": "Redis", "memory": "memory"}[st]
			note := ""
			if cache == "on" && len(off) > 0 && median(off) > 0 {
				note = fmt.Sprintf(" (%.1f× off)", median(ds)/median(off))
			}
			fmt.Fprintf(&b, "| %s | %s | %s%s | %s |\n", label, cache, span(ds), note, trim(median(calls), 3))
			rows++
		}
	}
	if rows == 0 {
		return "", fmt.Errorf("gobench: no BenchmarkRLSHotOverLimit result with decisions/s and store-calls/decision")
	}
	return b.String(), nil
}

// statuspageTable: BenchmarkDecisions's median decisions/s per outcome and
// mode, and the ratios that show what counting and the open page cost.
func statuspageTable(rs []Result) (string, error) {
	var b strings.Builder
	b.WriteString("| takes | bare | counted | page-open | page-open / counted | counted / bare |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	rows := 0
	for _, outcome := range []string{"granted", "denied"} {
		m := map[string]float64{}
		for _, mode := range []string{"bare", "counted", "page-open"} {
			if vs := values(rs, "BenchmarkDecisions/"+outcome+"/"+mode, "decisions/s"); len(vs) > 0 {
				m[mode] = median(vs)
			}
		}
		if len(m) < 3 || m["bare"] == 0 || m["counted"] == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f | %.2f |\n", outcome, thousands(m["bare"]), thousands(m["counted"]),
			thousands(m["page-open"]), m["page-open"]/m["counted"], m["counted"]/m["bare"])
		rows++
	}
	if rows == 0 {
		return "", fmt.Errorf("gobench: no BenchmarkDecisions result for every mode of an outcome")
	}
	return b.String(), nil
}

func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minMax(vs []float64) (float64, float64) {
	return slices.Min(vs), slices.Max(vs)
}

// span formats the range of vs with thousands separators ("1,970–4,352"),
// or the one value when they are all equal.
func span(vs []float64) string {
	lo, hi := minMax(vs)
	if thousands(lo) == thousands(hi) {
		return thousands(lo)
	}
	return thousands(lo) + "–" + thousands(hi)
}

// thousands formats v rounded to an integer, with commas every three
// digits.
func thousands(v float64) string {
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// trim formats v with at most prec decimals and no trailing zeros.
func trim(v float64, prec int) string {
	return strconv.FormatFloat(math.Round(v*math.Pow10(prec))/math.Pow10(prec), 'f', -1, 64)
}
