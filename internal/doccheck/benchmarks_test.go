package doccheck

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	blockBegin = regexp.MustCompile(`^<!-- ([a-z][a-z0-9-]*):begin -->$`)
	blockEnd   = regexp.MustCompile(`^<!-- ([a-z][a-z0-9-]*):end -->$`)
	// provenanceLine is the line benchmarks/cmd/benchdoc writes at the
	// head of each block: "Measured <date>, commit <hash>, <machine>:
	// `<command>`".
	provenanceLine = regexp.MustCompile("^Measured (20\\d\\d-\\d\\d-\\d\\d), commit ([0-9a-f]{7,40}), [^`]+: `([^`]+)`$")
	regenSections  = regexp.MustCompile(`(?m)^all=\(([^)]*)\)$`)
)

// TestBenchmarkTables checks docs/BENCHMARKS.md's form, which
// benchmarks/regen.sh relies on: every table lies between the begin and
// end markers of a section regen.sh knows, each section has one block,
// and each block opens with its provenance line (date, commit, machine,
// command), whose commit is in the repository's history.
func TestBenchmarkTables(t *testing.T) {
	doc := read(t, "docs/BENCHMARKS.md")
	m := regenSections.FindStringSubmatch(read(t, "benchmarks/regen.sh"))
	if m == nil {
		t.Fatal("benchmarks/regen.sh has no all=(...) line listing its sections")
	}
	sections := strings.Fields(m[1])
	var seen []string
	open, first := "", false
	inCode := false
	for i, line := range strings.Split(doc, "\n") {
		n := i + 1
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || strings.HasPrefix(line, "    ") {
			continue
		}
		if b := blockBegin.FindStringSubmatch(line); b != nil {
			if open != "" {
				t.Errorf("BENCHMARKS.md:%d: %s begins inside %s", n, b[1], open)
			}
			if slices.Contains(seen, b[1]) {
				t.Errorf("BENCHMARKS.md:%d: a second %s block", n, b[1])
			}
			if !slices.Contains(sections, b[1]) {
				t.Errorf("BENCHMARKS.md:%d: block %s is no section of benchmarks/regen.sh (%v)", n, b[1], sections)
			}
			open, first = b[1], true
			seen = append(seen, b[1])
			continue
		}
		if e := blockEnd.FindStringSubmatch(line); e != nil {
			if e[1] != open {
				t.Errorf("BENCHMARKS.md:%d: %s ends, but the open block is %q", n, e[1], open)
			}
			if first {
				t.Errorf("BENCHMARKS.md:%d: block %s is empty", n, e[1])
			}
			open = ""
			continue
		}
		if open != "" && first && strings.TrimSpace(line) != "" {
			first = false
			p := provenanceLine.FindStringSubmatch(line)
			if p == nil {
				t.Errorf("BENCHMARKS.md:%d: block %s opens with %q, want \"Measured <date>, commit <hash>, <machine>: `<command>`\"", n, open, line)
			} else {
				checkCommit(t, p[2], "BENCHMARKS.md block "+open)
			}
		}
		if strings.HasPrefix(line, "|") && open == "" {
			t.Errorf("BENCHMARKS.md:%d: a table line outside any <!-- NAME:begin/end --> block: %s", n, line)
		}
	}
	if open != "" {
		t.Errorf("BENCHMARKS.md: block %s never ends", open)
	}
	for _, s := range sections {
		if !slices.Contains(seen, s) {
			t.Errorf("benchmarks/regen.sh regenerates %s, which BENCHMARKS.md has no block for", s)
		}
	}
}

// checkCommit fails unless hash names a commit of the repository. A
// shallow clone may lack old commits, so there it only logs.
func checkCommit(t *testing.T, hash, where string) {
	t.Helper()
	if err := exec.Command("git", "-C", "../..", "cat-file", "-e", hash+"^{commit}").Run(); err != nil {
		out, _ := exec.Command("git", "-C", "../..", "rev-parse", "--is-shallow-repository").Output()
		if strings.TrimSpace(string(out)) == "true" {
			t.Logf("%s: commit %s is not in this shallow clone", where, hash)
			return
		}
		t.Errorf("%s: commit %s is not in the repository's history", where, hash)
	}
}
