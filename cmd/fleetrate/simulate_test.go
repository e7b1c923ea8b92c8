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
		{[]string{"--scenario", "year"}, `--scenario "year": want minute or month`},
		{[]string{"--period", "month day=15"}, "--period does not apply to --scenario minute"},
		{[]string{"--scenario", "month", "--window", "1h"}, "--window does not apply to --scenario month"},
		{[]string{"--scenario", "month", "--no-boundary"}, "--no-boundary does not apply to --scenario month"},
		{[]string{"--scenario", "month", "--quota", "0"}, "--quota must be above 0, got 0"},
		{[]string{"--scenario", "month", "--rate", "0"}, "--rate must be above 0, got 0"},
		{[]string{"--scenario", "month", "--days", "0"}, "--days must be above 0, got 0"},
		{[]string{"--scenario", "month", "--period", "month Mars/Olympus"}, `--period "month Mars/Olympus": calendar: time zone "Mars/Olympus": unknown`},
		{[]string{"--scenario", "month", "--period", "week"}, `period must be a month (the traffic is a month's), got "week sunday"`},
		{[]string{"--scenario", "month", "--month", "2026-13"}, `month "2026-13": want a year and month such as 2026-02`},
		{[]string{"--scenario", "month", "--out", "m.gif"}, `--out "m.gif": the chart is written as .png or .svg`},
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

// TestSimulateMonth runs the month scenario with the shared flags set: the
// report states them, and the chart is written.
func TestSimulateMonth(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "month.svg")
	var stdout, stderr bytes.Buffer
	args := []string{"simulate", "--scenario", "month", "--out", out, "--quota", "5000", "--rate", "1", "--burst", "60",
		"--boundary-span", "5m", "--period", "month day=1 Asia/Tokyo", "--month", "2026-03", "--days", "20"}
	if err := run(context.Background(), args, func(string) string { return "" }, &stdout, &stderr); err != nil {
		t.Fatalf("simulate: %v\n%s", err, stderr.String())
	}
	for _, want := range []string{
		"Simulated 20 days",
		"centred on the quota's window start Sun 2026-03-01 00:00 JST",
		"calendar quota 5000/month Asia/Tokyo + token bucket 60/min, burst 60",
		"5000 in the 5m before the boundary",
		"Sun 2026-03-01  <- boundary",
		"chart written to " + out,
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, stdout.String())
		}
	}
}
