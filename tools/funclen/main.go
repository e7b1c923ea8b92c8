// Command funclen lists the non-test functions of a Go tree that are
// longer than a bound, longest first, to keep the code's functions short
// (issue 17: none over about 60 lines without a reason in its comment).
//
//	go run ./tools/funclen            # this module, over 60 lines
//	go run ./tools/funclen -max 45 ./httplimit
//
// Each line gives the length in lines (signature to closing brace), the
// place and the name, and "reason" when the doc comment says why it is
// long (a sentence with "long because", such as "It is long because ...").
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// fn is one function longer than the bound.
type fn struct {
	lines  int
	place  string // file:line
	name   string // Type.Method or Func
	reason bool   // the doc comment says why it is long
}

func main() {
	max := flag.Int("max", 60, "list functions longer than this many lines")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	fns, err := walk(root, *max)
	if err != nil {
		fmt.Fprintln(os.Stderr, "funclen:", err)
		os.Exit(1)
	}
	write(os.Stdout, fns)
}

// walk lists the functions over max lines in the .go files under root,
// skipping tests, testdata and hidden directories.
func walk(root string, max int) ([]fn, error) {
	var fns []fn
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		long, err := longFuncs(fset, path, src, max)
		fns = append(fns, long...)
		return err
	})
	slices.SortStableFunc(fns, func(a, b fn) int { return b.lines - a.lines })
	return fns, err
}

// longFuncs returns the functions of one file that are over max lines.
func longFuncs(fset *token.FileSet, path string, src []byte, max int) ([]fn, error) {
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	var out []fn
	for _, decl := range f.Decls {
		fd, ok := decl.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		start, end := fset.Position(fd.Pos()), fset.Position(fd.End())
		if n := end.Line - start.Line + 1; n > max {
			out = append(out, fn{
				lines:  n,
				place:  fmt.Sprintf("%s:%d", path, start.Line),
				name:   funcName(fd),
				reason: fd.Doc != nil && strings.Contains(strings.ToLower(fd.Doc.Text()), "long because"),
			})
		}
	}
	return out, nil
}

// funcName is "Type.Method" for a method and the name for a function.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

func write(w io.Writer, fns []fn) {
	for _, f := range fns {
		reason := ""
		if f.reason {
			reason = "  (reason in its comment)"
		}
		fmt.Fprintf(w, "%4d  %s  %s%s\n", f.lines, f.place, f.name, reason)
	}
}
