// Command benchdoc turns the output of the benchmark commands into the
// tables of docs/BENCHMARKS.md and writes each table into the file
// between its markers. benchmarks/regen.sh drives it; by hand:
//
//	go test -run '^$' -bench BenchmarkDecisions -count 5 ./statuspage/ | benchdoc gobench -table statuspage > t.md
//	benchdoc splice -doc docs/BENCHMARKS.md -section statuspage -date 2026-12-04 -commit abc1234 \
//	    -machine '2 CPUs' -command "go test ..." < t.md
//
// Subcommands, each reading standard input and writing standard output:
//
//   - tables: the Markdown table lines of a `go test -v` log (t.Logf's
//     file:line prefixes removed); tables with the same header are merged
//     into one, so that tests that each log a row make one table.
//   - gobench -table memstore|overlimit|statuspage: the table of one
//     `go test -bench` run, from its metrics.
//   - bench: the table and the advice of `fleetrate bench --json`.
//   - splice -doc FILE -section NAME ...: replaces what lies between the
//     file's "<!-- NAME:begin -->" and "<!-- NAME:end -->" lines with a
//     provenance line (date, commit, machine, command) and the body read
//     from standard input.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchdoc:", err)
		os.Exit(1)
	}
}

func run(args []string, in io.Reader, out io.Writer) error {
	if len(args) == 0 {
		return errors.New("want a subcommand: tables, gobench, bench or splice")
	}
	input, err := io.ReadAll(in)
	if err != nil {
		return err
	}
	switch args[0] {
	case "tables":
		body := Tables(string(input))
		if body == "" {
			return errors.New("tables: the input holds no Markdown table")
		}
		_, err = io.WriteString(out, body)
		return err
	case "gobench":
		fs := flag.NewFlagSet("gobench", flag.ContinueOnError)
		table := fs.String("table", "", "which table: memstore, overlimit or statuspage")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		body, err := GoBenchTable(*table, ParseBench(string(input)))
		if err != nil {
			return err
		}
		_, err = io.WriteString(out, body)
		return err
	case "bench":
		body, err := BenchTable(input)
		if err != nil {
			return err
		}
		_, err = io.WriteString(out, body)
		return err
	case "splice":
		return spliceCmd(args[1:], input)
	}
	return fmt.Errorf("unknown subcommand %q (want tables, gobench, bench or splice)", args[0])
}

// Provenance is the line that heads every generated block: the date, the
// commit, the machine and the command, quoted as the project's docs quote
// every figure ("2026-12-04, commit abc1234, ...: `command`").
func Provenance(date, commit, machine, command string) string {
	return fmt.Sprintf("Measured %s, commit %s, %s: `%s`", date, commit, machine, command)
}

var (
	dateRE    = regexp.MustCompile(`^20\d\d-\d\d-\d\d$`)
	commitRE  = regexp.MustCompile(`^[0-9a-f]{7,40}$`)
	sectionRE = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
)

func spliceCmd(args []string, body []byte) error {
	fs := flag.NewFlagSet("splice", flag.ContinueOnError)
	doc := fs.String("doc", "", "the Markdown file to rewrite")
	section := fs.String("section", "", "the block's name, as in <!-- NAME:begin -->")
	date := fs.String("date", "", "the date of the run, YYYY-MM-DD")
	commit := fs.String("commit", "", "the commit the run measured")
	machine := fs.String("machine", "", "the machine, in a few words")
	command := fs.String("command", "", "the command that produced the body")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case !sectionRE.MatchString(*section):
		return fmt.Errorf("-section: %q is not a block name ([a-z][a-z0-9-]*)", *section)
	case !dateRE.MatchString(*date):
		return fmt.Errorf("-date: %q is not YYYY-MM-DD", *date)
	case !commitRE.MatchString(*commit):
		return fmt.Errorf("-commit: %q is not an abbreviated commit hash", *commit)
	case *machine == "" || strings.ContainsAny(*machine, "`\n"):
		return fmt.Errorf("-machine: %q must be one line without backquotes", *machine)
	case *command == "" || strings.ContainsAny(*command, "`\n"):
		return fmt.Errorf("-command: %q must be one line without backquotes", *command)
	case len(bytes.TrimSpace(body)) == 0:
		return errors.New("splice: the body (standard input) is empty; the command measured nothing")
	}
	old, err := os.ReadFile(*doc)
	if err != nil {
		return err
	}
	text := Provenance(*date, *commit, *machine, *command) + "\n\n" + strings.TrimSpace(string(body)) + "\n"
	updated, err := Splice(string(old), *section, text)
	if err != nil {
		return fmt.Errorf("%s: %w", *doc, err)
	}
	return os.WriteFile(*doc, []byte(updated), 0o644)
}

// Markers returns the lines between which the block named section lies.
func Markers(section string) (begin, end string) {
	return "<!-- " + section + ":begin -->", "<!-- " + section + ":end -->"
}

// Splice replaces the lines between doc's begin and end marker lines of
// section with body. Each marker must appear exactly once, as a line of its
// own, the begin before the end.
func Splice(doc, section, body string) (string, error) {
	begin, end := Markers(section)
	lines := strings.SplitAfter(doc, "\n")
	bi, ei := -1, -1
	for i, l := range lines {
		switch strings.TrimRight(l, "\r\n") {
		case begin:
			if bi >= 0 {
				return "", fmt.Errorf("%s appears twice", begin)
			}
			bi = i
		case end:
			if ei >= 0 {
				return "", fmt.Errorf("%s appears twice", end)
			}
			ei = i
		}
	}
	if bi < 0 || ei < 0 || ei < bi {
		return "", fmt.Errorf("no %s line followed by a %s line", begin, end)
	}
	var b strings.Builder
	for _, l := range lines[:bi+1] {
		b.WriteString(l)
	}
	b.WriteString(strings.TrimRight(body, "\n") + "\n")
	for _, l := range lines[ei:] {
		b.WriteString(l)
	}
	return b.String(), nil
}
