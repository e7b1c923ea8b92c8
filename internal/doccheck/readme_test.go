package doccheck

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/fleetrate/fleetrate"

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile("../../" + path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// section returns the text of the README's "## name" section, up to the
// next "## " heading.
func section(t *testing.T, doc, name string) string {
	t.Helper()
	start := strings.Index(doc, "\n## "+name+"\n")
	if start < 0 {
		t.Fatalf("README has no section %q", name)
	}
	rest := doc[start+len(name)+5:]
	if end := strings.Index(rest, "\n## "); end >= 0 {
		rest = rest[:end]
	}
	return rest
}

// TestPackageTable checks that the README's package table has a row for
// every package `go list ./...` lists outside internal/ (internal/... is one
// row, and so is each package's own internal/...), and no row for a package that does not exist.
func TestPackageTable(t *testing.T) {
	cmd := exec.Command("go", "list", "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	want := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, module), "/")
		switch {
		case rel == "":
			rel = "fleetrate"
		case strings.HasPrefix(rel, "internal/"):
			rel = "internal/..."
		case strings.Contains(rel, "/internal/"):
			rel = rel[:strings.Index(rel, "/internal/")] + "/internal/..."
		}
		want[rel] = true
	}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	got := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(section(t, read(t, "README.md"), "Packages"), -1) {
		got[m[1]] = true
	}
	for p := range want {
		if !got[p] {
			t.Errorf("README's package table has no row for %s (go list ./... lists it)", p)
		}
	}
	for p := range got {
		if !want[p] {
			t.Errorf("README's package table has a row for %s, which go list ./... does not list", p)
		}
	}
}

var (
	number  = regexp.MustCompile(`\d[\d,]*(\.\d+)?`)
	date    = regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b`)
	command = regexp.MustCompile("`[^`]*go (run|test) [^`]*`")
	// figure matches a measured quantity: a ratio, a latency, a rate of
	// decisions or a percentage.
	figure = regexp.MustCompile(`\d(\.\d+)?\s?(×|µs|ns/op|decisions/s|%)`)
)

// TestPerformanceFigures checks the README's performance section: at most
// three figures, each with the command that reproduces it and the date and
// commit it was run at, and each of its numbers as it appears in
// docs/BENCHMARKS.md.
func TestPerformanceFigures(t *testing.T) {
	perf := section(t, read(t, "README.md"), "Performance")
	bench := read(t, "docs/BENCHMARKS.md")
	benchNumbers := number.FindAllString(bench, -1)
	bullets := strings.Split(perf, "\n- ")[1:]
	if len(bullets) > 3 {
		t.Errorf("README quotes %d performance figures, want at most 3", len(bullets))
	}
	if len(bullets) == 0 {
		t.Fatal("README's performance section quotes no figure")
	}
	for _, b := range bullets {
		if !date.MatchString(b) {
			t.Errorf("performance figure without a date: %q", b)
		}
		if !command.MatchString(b) {
			t.Errorf("performance figure without the command that reproduces it: %q", b)
		}
		if !provenanceQuote.MatchString(b) {
			t.Errorf("performance figure without its date and commit quoted as \"YYYY-MM-DD, commit <hash>\": %q", b)
		}
		// Numbers inside the command, the date and the commit are not
		// figures.
		text := date.ReplaceAllString(command.ReplaceAllString(provenanceQuote.ReplaceAllString(b, ""), ""), "")
		for _, n := range number.FindAllString(text, -1) {
			if !slices.Contains(benchNumbers, n) {
				t.Errorf("README quotes %s, which docs/BENCHMARKS.md does not: %q", n, b)
			}
		}
	}
}

// TestNoFigureElsewhere checks that the README states measured figures
// only in its performance section (code blocks, such as the demo's output
// with its command and date above it, aside).
func TestNoFigureElsewhere(t *testing.T) {
	readme := read(t, "README.md")
	perf := section(t, readme, "Performance")
	rest := strings.Replace(readme, perf, "", 1)
	inCode := false
	for i, line := range strings.Split(rest, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || strings.HasPrefix(line, "    ") {
			continue
		}
		if m := figure.FindString(line); m != "" {
			t.Errorf("README line %d states %q outside its performance section: %s", i+1, m, line)
		}
	}
}

// maxReadmeLines is issue 35's bound on the README: a newcomer reads it
// in five minutes; everything else lives in docs/ and the package docs.
const maxReadmeLines = 260

// TestReadmeLength keeps the README within maxReadmeLines lines.
func TestReadmeLength(t *testing.T) {
	if n := strings.Count(read(t, "README.md"), "\n"); n > maxReadmeLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail to docs/ or a package doc", n, maxReadmeLines)
	}
}
