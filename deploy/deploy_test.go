// Package deploy holds the Prometheus alert rules and the Grafana
// dashboard for fleetrate (see docs/OPERATIONS.md); its tests check them
// against the metrics the code exports and, with promtool, their PromQL
// and each alert's behaviour.
package deploy

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fleetrate/fleetrate/internal/harness/tool"
)

const (
	rulesFile     = "prometheus/fleetrate-alerts.yml"
	rulesTestFile = "prometheus/fleetrate-alerts_test.yml"
	dashboardFile = "grafana/fleetrate.json"
)

// exportedMetrics greps the module's non-test Go files for the metrics
// they register: "fleetrate_..." literals, and the server's names, built
// from the "fleetrate" namespace and a Name field.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	literal := regexp.MustCompile(`"(fleetrate_[a-z_]+)"`)
	field := regexp.MustCompile(`Name:\s+"([a-z_]+)"`)
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "benchmarks" || d.Name() == "examples" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllStringSubmatch(string(src), -1) {
			names[m[1]] = true
		}
		if strings.Contains(string(src), "Namespace: metricsNamespace") {
			for _, m := range field.FindAllStringSubmatch(string(src), -1) {
				names["fleetrate_"+m[1]] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// usedMetrics returns the fleetrate metric names in text, without the
// _bucket, _sum and _count series suffixes of histograms.
func usedMetrics(text string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`fleetrate_[a-z_]+`).FindAllString(text, -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			m = strings.TrimSuffix(m, suffix)
		}
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

func TestMetricNamesAreExported(t *testing.T) {
	t.Parallel()
	exported := exportedMetrics(t)
	for _, want := range []string{"fleetrate_decisions_total", "fleetrate_breaker_open", "fleetrate_transport_rate_limited_total"} {
		if !exported[want] {
			t.Fatalf("the grep of the code misses %s; found %v", want, exported)
		}
	}
	for _, file := range []string{rulesFile, rulesTestFile, dashboardFile} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		used := usedMetrics(string(data))
		if len(used) == 0 {
			t.Errorf("%s names no fleetrate metric", file)
		}
		for _, m := range used {
			if !exported[m] {
				t.Errorf("%s uses %s, which the code does not export", file, m)
			}
		}
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title  string `json:"title"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func TestDashboardCoversWhatOperatorsNeed(t *testing.T) {
	t.Parallel()
	d := readDashboard(t)
	ids := map[int]bool{}
	var exprs []string
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d appears twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	all := strings.Join(exprs, "\n")
	for _, m := range []string{
		"fleetrate_decisions_total", "fleetrate_store_duration_seconds_bucket", "fleetrate_store_errors_total",
		"fleetrate_breaker_open", "fleetrate_transport_rate_limited_total", "fleetrate_transport_wait_seconds_bucket",
		"fleetrate_transport_gave_up_total", "fleetrate_transport_effective_rate", "fleetrate_transport_persistent_limit_total",
		"fleetrate_transport_late_rebooked_total",
	} {
		if !strings.Contains(all, m) {
			t.Errorf("the dashboard has no panel on %s", m)
		}
	}
}

// promtool returns promtool's path, or fails or skips the test (package
// tool) saying how to install it.
func promtool(t *testing.T) string {
	t.Helper()
	return tool.Find(t, "the alert rules' checks; Debian's prometheus package ships it", "promtool")
}

func runPromtool(t *testing.T, bin string, args ...string) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

func TestAlertRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	runPromtool(t, bin, "check", "rules", rulesFile)
	runPromtool(t, bin, "test", "rules", rulesTestFile)
}

// TestDashboardQueriesParse checks every dashboard query with promtool, as
// recording rules, after replacing Grafana's variables.
func TestDashboardQueriesParse(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	d := readDashboard(t)
	vars := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			n++
			expr, err := json.Marshal(vars.Replace(tg.Expr)) // a JSON string is a YAML string
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "      - record: dashboard:query%d\n        expr: %s\n", n, expr)
		}
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, bin, "check", "rules", path)
}

// TestEveryAlertIsTested checks that the promtool unit tests evaluate
// every alert at least twice: once firing and once not (promtool checks
// what each evaluation expects; this checks that there are both).
func TestEveryAlertIsTested(t *testing.T) {
	t.Parallel()
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`(?m)^\s*- alert: (\w+)$`).FindAllStringSubmatch(string(rules), -1)
	if len(names) == 0 {
		t.Fatalf("%s has no alert", rulesFile)
	}
	// An evaluation: its alert name, then whether it expects none.
	evals := regexp.MustCompile(`alertname: (\w+)\s+exp_alerts:(\s*\[\])?`).FindAllStringSubmatch(string(tests), -1)
	for _, n := range names {
		var firing, quiet int
		for _, e := range evals {
			switch {
			case e[1] != n[1]:
			case e[2] != "":
				quiet++
			default:
				firing++
			}
		}
		if firing == 0 || quiet == 0 {
			t.Errorf("alert %s: %d evaluations expect it firing and %d expect it quiet in %s; want at least one of each",
				n[1], firing, quiet, rulesTestFile)
		}
	}
}
