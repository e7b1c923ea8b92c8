package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimulateFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--quota", "0"}, "--quota must be above 0, got 0"},
		{[]string{"--burst", "0"}, "--burst must be above 0, got 0"},
		{[]string{"--window", "0"}, "--window must be above 0, got 0"},
		{[]string{"--duration", "0"}, "--duration must be above 0, got 0"},
		{[]string{"--span", "0"}, "--span must be above 0, got 0"},
		{[]string{"--cron-batch", "0"}, "--cron-batch must be above 0, got 0"},
		{[]string{"--boundary", "0"}, "--boundary must be above 0, got 0"},
		{[]string{"--boundary-span", "0"}, "--boundary-span must be above 0, got 0"},
		{[]string{"--cron-clients", "-1"}, "--cron-clients must be 0 (none) or more, got -1"},
		{[]string{"--out", "chart.gif"}, `--out "chart.gif": the chart is written as .png or .svg`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"simulate", "--out", ""}, tc.args...)
			err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestSimulateWritesReportAndChart: the command prints its report and
// writes the chart where --out says.
func TestSimulateWritesReportAndChart(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "sim.svg")
	var stdout, stderr bytes.Buffer
	args := []string{"simulate", "--out", out, "--duration", "2m"}
	if err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("simulate: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "chart written to "+out) {
		t.Errorf("report does not name the chart:\n%s", stdout.String())
	}
}
