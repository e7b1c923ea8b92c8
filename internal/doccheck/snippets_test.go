package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// snippetDocs are the reference docs whose Go examples must compile.
var snippetDocs = []string{"docs/OPERATIONS.md", "docs/API.md", "docs/HEADERS.md", "docs/ARCHITECTURE.md"}

// snippetImports maps the package names a snippet may use to their
// import paths.
var snippetImports = map[string]string{
	"fleetrate":   "github.com/fleetrate/fleetrate",
	"failsafe":    "github.com/fleetrate/fleetrate/failsafe",
	"gcra":        "github.com/fleetrate/fleetrate/gcra",
	"httplimit":   "github.com/fleetrate/fleetrate/httplimit",
	"lease":       "github.com/fleetrate/fleetrate/lease",
	"memstore":    "github.com/fleetrate/fleetrate/memstore",
	"overlimit":   "github.com/fleetrate/fleetrate/overlimit",
	"redisstore":  "github.com/fleetrate/fleetrate/redisstore",
	"remotestore": "github.com/fleetrate/fleetrate/remotestore",
	"statuspage":  "github.com/fleetrate/fleetrate/statuspage",
	"transport":   "github.com/fleetrate/fleetrate/transport",
	"redis":       "github.com/redis/go-redis/v9",
	"prometheus":  "github.com/prometheus/client_golang/prometheus",
	"context":     "context",
	"errors":      "errors",
	"fmt":         "fmt",
	"http":        "net/http",
	"slog":        "log/slog",
	"time":        "time",
	"tls":         "crypto/tls",
	"x509":        "crypto/x509",
}

// snippetContext declares, at package level, the values the docs'
// snippets take as given (a store made earlier, the page's registry, ...).
const snippetContext = `package snippets

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/fleetrate/fleetrate"
	"github.com/fleetrate/fleetrate/gcra"
	"github.com/fleetrate/fleetrate/redisstore"
	"github.com/fleetrate/fleetrate/transport"
)

var (
	ctx            context.Context
	cfg            fleetrate.Config
	store          fleetrate.Store
	redisStore     *redisstore.Store
	failoverClient *redis.Client
	opts           *redis.Options
	registry       *prometheus.Registry
	up             transport.Upstream
	mux            *http.ServeMux
	pool           *x509.CertPool
	logger         *slog.Logger
	key            string
	k              int64
	d              time.Duration
	now            int64
	req            fleetrate.Request
	states         []gcra.State
)
`

// goBlock is one ```go block of a doc: its first line's number and text.
type goBlock struct {
	line int
	text string
}

// inlineCall is a call of an exported function of a fleetrate package,
// quoted inline in a doc's prose.
var inlineCall = regexp.MustCompile("`((?:fleetrate|failsafe|gcra|httplimit|lease|memstore|overlimit|redisstore|remotestore|statuspage|transport)\\.[A-Z][A-Za-z0-9]*\\([^`]*\\))`")

// goBlocks returns the ```go blocks of doc, and each call quoted inline
// (such as `fleetrate.PerPeriod(100, time.Minute)`) as a block of its own.
func goBlocks(doc string) []goBlock {
	var blocks []goBlock
	for i, l := range strings.Split(doc, "\n") {
		for _, m := range inlineCall.FindAllStringSubmatch(l, -1) {
			blocks = append(blocks, goBlock{line: i + 1, text: m[1] + "\n"})
		}
	}
	var cur *goBlock
	for i, l := range strings.Split(doc, "\n") {
		switch {
		case cur == nil && strings.TrimSpace(l) == "```go":
			cur = &goBlock{line: i + 2}
		case cur != nil && strings.TrimSpace(l) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		}
	}
	return blocks
}

// snippetFile wraps block, a run of statements or of top-level
// declarations, in a Go file of package snippets whose //line directive
// points compile errors at the doc's own lines.
func snippetFile(t *testing.T, doc string, n int, b goBlock) string {
	t.Helper()
	topLevel := regexp.MustCompile(`(?m)^(func|type|var|const) `).MatchString(b.text)
	var imports []string
	for name, path := range snippetImports {
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(b.text) {
			imports = append(imports, fmt.Sprintf("\t%q\n", path))
		}
	}
	slices.Sort(imports)
	var f strings.Builder
	fmt.Fprintf(&f, "package snippets\n\nimport (\n%s)\n\n", strings.Join(imports, ""))
	if topLevel {
		fmt.Fprintf(&f, "//line %s:%d\n%s", doc, b.line, b.text)
		return f.String()
	}
	fmt.Fprintf(&f, "func snippet%d() {\n//line %s:%d\n%s", n, doc, b.line, b.text)
	// A doc declares values for the reader to use next: use them here.
	for _, name := range declared(t, doc, b) {
		fmt.Fprintf(&f, "\t_ = %s\n", name)
	}
	f.WriteString("}\n")
	return f.String()
}

// declared returns the names the statements of b declare at their top
// level.
func declared(t *testing.T, doc string, b goBlock) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+b.text+"\n}\n", 0)
	if err != nil {
		t.Fatalf("%s:%d: the Go block does not parse: %v", doc, b.line, err)
	}
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" && !slices.Contains(names, id.Name) {
			names = append(names, id.Name)
		}
	}
	for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, e := range st.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			for _, sp := range st.Decl.(*ast.GenDecl).Specs {
				if vs, ok := sp.(*ast.ValueSpec); ok {
					for _, id := range vs.Names {
						add(id)
					}
				}
			}
		}
	}
	return names
}

// TestDocGoSnippetsCompile builds and vets every ```go block of the
// reference docs, as statements in a function (or as declarations), in a
// package of this module, with the values they take as given declared
// beside them.
func TestDocGoSnippetsCompile(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not in PATH: %v", err)
	}
	base := filepath.Join(refRoot, "internal", "doccheck", "testdata")
	if err := os.MkdirAll(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(base, "snippets")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.RemoveAll(dir)
		_ = os.Remove(base) // only if empty
	})
	if err := os.WriteFile(filepath.Join(dir, "context.go"), []byte(snippetContext), 0o644); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, doc := range snippetDocs {
		abs, err := filepath.Abs(filepath.Join(refRoot, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range goBlocks(readRefDoc(t, doc)) {
			n++
			name := filepath.Join(dir, fmt.Sprintf("snippet%d.go", n))
			if err := os.WriteFile(name, []byte(snippetFile(t, abs, n, b)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n == 0 {
		t.Fatal("no ```go block found in the reference docs")
	}
	rel, err := filepath.Rel(refRoot, dir)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goBin, "vet", "./"+filepath.ToSlash(rel))
	cmd.Dir = refRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the docs' Go examples do not compile (go vet: %v):\n%s", err, out)
	}
	t.Logf("%d Go examples (blocks and inline calls) compile and pass go vet", n)
}
