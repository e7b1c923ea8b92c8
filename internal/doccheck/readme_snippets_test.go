package doccheck

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"regexp"
	"strings"
	"testing"
)

// readmeSnippetImports are the packages the README's Go snippets use; the
// snippets are statements, so the test supplies the imports and the
// variables they take from their surroundings.
var readmeSnippetImports = []string{
	"context", "errors", "log", "net/http", "time",
	"github.com/prometheus/client_golang/prometheus",
	"github.com/redis/go-redis/v9",
	"github.com/fleetrate/fleetrate",
	"github.com/fleetrate/fleetrate/calendar",
	"github.com/fleetrate/fleetrate/failsafe",
	"github.com/fleetrate/fleetrate/httplimit",
	"github.com/fleetrate/fleetrate/memstore",
	"github.com/fleetrate/fleetrate/redisstore",
	"github.com/fleetrate/fleetrate/transport",
}

// TestReadmeSnippetsCompile type-checks every Go block of the README as
// the body of a function, with the surroundings a program would give it
// (a ctx, a redisURL flag, a mux and a handler). Unused names are allowed:
// a snippet shows a step, not a whole program.
func TestReadmeSnippetsCompile(t *testing.T) {
	checkSnippets(t, "README.md", "ctx context.Context, redisURL *string, mux *http.ServeMux, createMessage http.Handler")
}

// TestGuideSnippetsCompile does the same for docs/GUIDE.md, whose snippets
// take a store and a limiter.
func TestGuideSnippetsCompile(t *testing.T) {
	checkSnippets(t, "docs/GUIDE.md", "ctx context.Context, store fleetrate.Store, lim *fleetrate.Limiter")
}

func checkSnippets(t *testing.T, doc, params string) {
	t.Helper()
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(read(t, doc), -1)
	if len(blocks) == 0 {
		t.Fatalf("%s has no Go snippet", doc)
	}
	var src strings.Builder
	src.WriteString("package snippets\n\nimport (\n")
	for _, p := range readmeSnippetImports {
		fmt.Fprintf(&src, "\t%q\n", p)
	}
	src.WriteString(")\n\n")
	for i, b := range blocks {
		fmt.Fprintf(&src, "func snippet%d(%s) error {\n%s\treturn nil\n}\n\n", i, params, b[1])
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "README.go", src.String(), 0)
	if err != nil {
		t.Fatalf("%s's Go snippets do not parse: %v\n%s", doc, err, src.String())
	}
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "source", nil),
		Error: func(err error) {
			msg := err.Error()
			if strings.Contains(msg, "not used") {
				return
			}
			t.Errorf("%s snippet: %v", doc, err)
		},
	}
	_, _ = conf.Check("snippets", fset, []*ast.File{f}, nil)
}
