package doccheck

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// archGoFolders returns the folders of the repository that hold Go code (both
// modules: the root's and benchmarks'), as slash paths from the root, the
// root itself as ".".
func archGoFolders(t *testing.T) []string {
	t.Helper()
	seen := map[string]bool{}
	err := filepath.WalkDir(refRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != refRoot && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") {
			rel, err := filepath.Rel(refRoot, filepath.Dir(path))
			if err != nil {
				return err
			}
			seen[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for d := range seen {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	return dirs
}

var archBackticked = regexp.MustCompile("`([^`]+)`")

// archNamedFolders returns the folders the tables of ARCHITECTURE.md's
// "Packages, folder by folder" name in their first column; "fleetrate"
// (the root package) is ".".
func archNamedFolders(t *testing.T, doc string) []string {
	t.Helper()
	i := strings.Index(doc, "### Packages, folder by folder")
	if i < 0 {
		t.Fatal(`docs/ARCHITECTURE.md has no "### Packages, folder by folder" section`)
	}
	sec := doc[i:]
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	var named []string
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || !strings.HasPrefix(line, "|") {
			continue
		}
		for _, m := range archBackticked.FindAllStringSubmatch(cells[1], -1) {
			name := m[1]
			if name == "fleetrate" {
				name = "."
			}
			named = append(named, name)
		}
	}
	return named
}

// TestArchitectureNamesEveryPackage checks ARCHITECTURE.md's package
// tables against the folders: every folder holding Go code is named, and
// every name is such a folder.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	doc := readRefDoc(t, "docs/ARCHITECTURE.md")
	named := archNamedFolders(t, doc)
	folders := archGoFolders(t)
	for _, f := range folders {
		if !slices.Contains(named, f) {
			t.Errorf("docs/ARCHITECTURE.md, \"Packages, folder by folder\", does not name %s", f)
		}
	}
	for _, n := range named {
		if !slices.Contains(folders, n) {
			t.Errorf("docs/ARCHITECTURE.md, \"Packages, folder by folder\", names %s, which holds no Go code", n)
		}
	}
}

// TestDocPathsExist checks that every repository path the four reference
// docs name exists: paths that begin with a top-level folder of the
// repository (globs such as redisstore/scripts/*.lua included), Go and Lua
// files named alone, and relative links.
func TestDocPathsExist(t *testing.T) {
	entries, err := os.ReadDir(refRoot)
	if err != nil {
		t.Fatal(err)
	}
	var tops []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			tops = append(tops, regexp.QuoteMeta(e.Name()))
		}
	}
	path := regexp.MustCompile(`(?:^|[\s(\x60"])((?:` + strings.Join(tops, "|") + `)/[A-Za-z0-9_.*/-]*[A-Za-z0-9_*/])`)
	file := regexp.MustCompile("`([A-Za-z0-9_]+\\.(?:go|lua))`")
	link := regexp.MustCompile(`\]\(([A-Za-z0-9_./-]*?)(?:#([^)]*))?\)`)
	sources := archSourceFiles(t)
	for _, name := range []string{"docs/OPERATIONS.md", "docs/API.md", "docs/HEADERS.md", "docs/ARCHITECTURE.md"} {
		doc := readRefDoc(t, name)
		for _, m := range path.FindAllStringSubmatch(doc, -1) {
			p := strings.TrimSuffix(m[1], ".")
			got, err := filepath.Glob(filepath.Join(refRoot, filepath.FromSlash(p)))
			if err != nil || len(got) == 0 {
				t.Errorf("%s names %s, which does not exist", name, p)
			}
		}
		for _, m := range file.FindAllStringSubmatch(doc, -1) {
			if !sources[m[1]] {
				t.Errorf("%s names %s, which no folder holds", name, m[1])
			}
		}
		for _, m := range link.FindAllStringSubmatch(doc, -1) {
			target, anchor := m[1], m[2]
			if target == "" {
				target = filepath.Base(name)
			}
			file := filepath.Join(refRoot, "docs", filepath.FromSlash(target))
			if _, err := os.Stat(file); err != nil {
				t.Errorf("%s links to %s, which does not exist", name, target)
				continue
			}
			if anchor != "" && strings.HasSuffix(target, ".md") && !archAnchors(t, file)[anchor] {
				t.Errorf("%s links to %s#%s, a heading %s does not have", name, target, anchor, target)
			}
		}
	}
}

// archAnchors returns the anchors GitHub gives the headings of the
// Markdown file at path: lower case, punctuation dropped, spaces as
// hyphens, a repeated one numbered.
func archAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var slug strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		a := slug.String()
		if n := seen[a]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
	}
	return anchors
}

// archSourceFiles returns the base names of the repository's Go and Lua files.
func archSourceFiles(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir(refRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != refRoot && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if ext := filepath.Ext(d.Name()); ext == ".go" || ext == ".lua" {
			names[d.Name()] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}
