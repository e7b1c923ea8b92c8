package doccheck

import (
	"regexp"
	"strings"
	"testing"
)

var (
	// measureWord marks a block that reports a measurement rather than a
	// setting: "measured" (but not "the measured ...", a reference to one
	// elsewhere), a percentile, a rate of decisions, ns/op, goodput.
	measureWord = regexp.MustCompile(`(^|[^e] )[Mm]easured\b|\bp50\b|\bp99\b|decisions/s|ns/op|per CPU-second|[Gg]oodput`)
	// measureFigure is a number with the unit of a measurement (seconds
	// and tokens only after a space, so that "429s" is no figure).
	measureFigure = regexp.MustCompile(`\d(\.\d+)?\s?(ms|µs|%|×|MiB|decisions/s|ns/op)(\W|$)|\d(\.\d+)?\s(s|tokens)(\W|$)`)
	// provenanceQuote is how the docs quote a measurement's date and commit
	// ("2026-12-04, commit abc1234"), as BENCHMARKS.md's "Measured" lines do.
	provenanceQuote = regexp.MustCompile(`\b(20\d\d-\d\d-\d\d),\s+commit\s+([0-9a-f]{7,40})\b`)
	// measureCommand is a command that reproduces a figure.
	measureCommand = regexp.MustCompile("`[^`]*(go (test|run|build)|fleetrate |regen\\.sh|faultbench|servebench|fleetbench)[^`]*`|^\\s*(go (test|run)|cd benchmarks|taskset|benchmarks/)")
	inlineCode     = regexp.MustCompile("`[^`]*`")
)

// docBlock is a paragraph, a top-level list item or a table of a Markdown
// file, with the heading it falls under.
type docBlock struct {
	line    int    // first line, from 1
	section int    // index of its heading
	text    string // its lines joined by spaces
	code    bool   // a fenced code block
}

// blocks splits doc into blocks. A table is one block; a fenced code
// block is one block, marked as code.
func blocks(doc string) []docBlock {
	var out []docBlock
	var cur []string
	start, section := 0, 0
	inCode, inTable := false, false
	flush := func(code bool) {
		if len(cur) > 0 {
			out = append(out, docBlock{line: start, section: section, text: strings.Join(cur, " "), code: code})
		}
		cur = nil
	}
	for i, line := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(line, "```"):
			if inCode {
				flush(true)
			} else {
				flush(false)
				start = i + 2
			}
			inCode = !inCode
			continue
		case inCode:
			cur = append(cur, line)
			continue
		case strings.HasPrefix(line, "#"):
			flush(false)
			section++
			continue
		case strings.TrimSpace(line) == "":
			flush(false)
			inTable = false
			continue
		case strings.HasPrefix(line, "|") != inTable:
			flush(false)
			inTable = strings.HasPrefix(line, "|")
		case strings.HasPrefix(line, "- ") || strings.HasPrefix(line, "* "):
			flush(false)
		}
		if len(cur) == 0 {
			start = i + 1
		}
		cur = append(cur, strings.TrimSpace(line))
	}
	flush(inCode)
	return out
}

// TestFiguresHaveProvenance checks that every measured figure in the
// README, docs/OPERATIONS.md and docs/API.md has its date, commit and
// command beside it: a block (paragraph, list item or table) that reports
// a measurement (a measure word and a figure with a unit) must quote
// "<date>, commit <hash>", or follow a block of its section that does (a
// section's introduction covers its tables and lists), and a command
// that reproduces it must appear in the block or earlier in its section.
// Each quoted commit must be in the repository's history. The rule is a
// floor: it cannot tell a figure from a setting without the measure
// words, so settings ("a 50 ms timeout") pass and a measured figure
// stated without any of them would too.
func TestFiguresHaveProvenance(t *testing.T) {
	for _, path := range []string{"README.md", "docs/OPERATIONS.md", "docs/API.md"} {
		bs := blocks(read(t, path))
		quoted, commanded := map[int]bool{}, map[int]bool{}
		for _, b := range bs {
			if measureCommand.MatchString(b.text) || (b.code && strings.Contains(b.text, "go ")) {
				commanded[b.section] = true
			}
			for _, m := range provenanceQuote.FindAllStringSubmatch(b.text, -1) {
				quoted[b.section] = true
				checkCommit(t, m[2], path)
			}
			if b.code {
				continue
			}
			prose := inlineCode.ReplaceAllString(b.text, "")
			if !measureWord.MatchString(prose) || !measureFigure.MatchString(prose) {
				continue
			}
			own := provenanceQuote.MatchString(b.text)
			if para := !strings.HasPrefix(b.text, "|") && !strings.HasPrefix(b.text, "- ") && !strings.HasPrefix(b.text, "* "); para && !own {
				t.Errorf("%s:%d: a paragraph with a measured figure must quote its own date and commit (\"YYYY-MM-DD, commit <hash>\"): %.160s", path, b.line, b.text)
			} else if !quoted[b.section] {
				t.Errorf("%s:%d: a measured figure without its date and commit (quote \"YYYY-MM-DD, commit <hash>\" here or in its section's introduction): %.160s", path, b.line, b.text)
			}
			if !commanded[b.section] {
				t.Errorf("%s:%d: a measured figure without the command that reproduces it: %.160s", path, b.line, b.text)
			}
		}
	}
}
