package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

// logPrefix is what t.Logf puts before a line in a `go test -v` log: the
// indentation and the file:line of the call.
var logPrefix = regexp.MustCompile(`^\s*([\w.-]+\.go:\d+: )?\s*`)

// Tables returns the Markdown tables of a `go test -v` log (or of any
// output), in the order they first appear, one blank line apart. A table is
// a run of lines that start with "|" once t.Logf's prefix is removed, its
// second line a separator ("|---|" or "| ---: |"). A table whose header and
// separator equal an earlier table's is appended to it, so that tests that
// each log a header and their row make one table. Lines that are not in a
// table are dropped.
func Tables(log string) string {
	type table struct {
		head string
		rows []string
	}
	var tables []*table
	byHead := map[string]*table{}
	var cur []string
	flush := func() {
		if len(cur) >= 2 && isSeparator(cur[1]) {
			head := cur[0] + "\n" + cur[1]
			t := byHead[head]
			if t == nil {
				t = &table{head: head}
				byHead[head] = t
				tables = append(tables, t)
			}
			t.rows = append(t.rows, cur[2:]...)
		}
		cur = nil
	}
	for _, line := range strings.Split(log, "\n") {
		l := strings.TrimRight(logPrefix.ReplaceAllString(line, ""), " \r")
		if strings.HasPrefix(l, "|") && strings.HasSuffix(l, "|") && len(l) > 1 {
			cur = append(cur, l)
			continue
		}
		flush()
	}
	flush()
	var b strings.Builder
	for i, t := range tables {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(t.head + "\n")
		for _, r := range t.rows {
			b.WriteString(r + "\n")
		}
	}
	return b.String()
}

var separatorCell = regexp.MustCompile(`^\s*:?-{3,}:?\s*$`)

// isSeparator reports whether a table line is a header separator.
func isSeparator(l string) bool {
	cells := strings.Split(strings.Trim(l, "|"), "|")
	for _, c := range cells {
		if !separatorCell.MatchString(c) {
			return false
		}
	}
	return len(cells) > 0
}

// benchReport is the part of `fleetrate bench --json` the table shows.
type benchReport struct {
	Rows []struct {
		Mode        string  `json:"mode"`
		Config      string  `json:"config"`
		Concurrency int     `json:"concurrency"`
		Keys        int     `json:"keys"`
		PerSecond   float64 `json:"decisions_per_second"`
		OfCeiling   float64 `json:"of_ceiling"`
		P50Micros   float64 `json:"p50_us"`
		P99Micros   float64 `json:"p99_us"`
	} `json:"rows"`
	Recommendations []struct {
		Setting string `json:"setting"`
		Value   string `json:"value"`
		Why     string `json:"why"`
	} `json:"recommendations"`
	Stopped string `json:"stopped"`
}

// BenchTable formats a `fleetrate bench --json` report as the excerpt of
// docs/BENCHMARKS.md: the Allow rows at 1 and 64 callers (one key and
// 10,000 keys) and the lease row, then the advice.
func BenchTable(js []byte) (string, error) {
	var rep benchReport
	if err := json.Unmarshal(js, &rep); err != nil {
		return "", fmt.Errorf("bench: the input is not `fleetrate bench --json` output: %w", err)
	}
	if rep.Stopped != "" {
		return "", fmt.Errorf("bench: the run stopped early: %s", rep.Stopped)
	}
	var b strings.Builder
	b.WriteString("| mode | config | callers | keys | decisions/s | × ceiling | p50 µs | p99 µs |\n|---|---|---|---|---|---|---|---|\n")
	rows := 0
	for _, r := range rep.Rows {
		if r.Mode != "allow" || (r.Concurrency != 1 && r.Concurrency != 64) {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %.0f | %.2f | %.0f | %.0f |\n", r.Mode, r.Config, r.Concurrency, r.Keys,
			r.PerSecond, r.OfCeiling, r.P50Micros, r.P99Micros)
		rows++
	}
	if rows == 0 {
		return "", fmt.Errorf("bench: the report has no Allow row at 1 or 64 callers")
	}
	if len(rep.Recommendations) > 0 {
		b.WriteString("\nIts advice:\n\n")
		for _, a := range rep.Recommendations {
			fmt.Fprintf(&b, "- %s: %s (%s)\n", a.Setting, a.Value, strings.Join(strings.Fields(a.Why), " "))
		}
	}
	return b.String(), nil
}
