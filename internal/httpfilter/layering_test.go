package httpfilter

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/abox-dev/abox/"

// engineDeps are the only packages of this module the HTTP/1 engine
// (h1 the server side, h1client the client side and its pool) and the
// connection plumbing (connio) may reach, directly or through one another:
// each other (h1client over h1 over connio, never the reverse) and the
// panic reporter. None may reach a policy package (allowlist, policy,
// reqrules, secrets, gitpush, decisionlog, egress, netclass, explain,
// resolver, ...) or httpfilter itself: what they do with a request's bytes is the same
// whatever the policy says, so a reviewer reads what reaches the internet
// in httpfilter alone. A package added here must know no policy either.
var engineDeps = map[string][]string{
	"internal/httpfilter/connio":   {"internal/contain"},
	"internal/httpfilter/h1":       {"internal/contain", "internal/httpfilter/connio"},
	"internal/httpfilter/h1client": {"internal/contain", "internal/httpfilter/connio", "internal/httpfilter/h1"},
}

// TestEngineKnowsNoPolicy walks the module's imports from h1, h1client and
// connio (build-tagged files and all, tests left out) and fails on any
// package of the module outside engineDeps.
func TestEngineKnowsNoPolicy(t *testing.T) {
	for pkg, allowed := range engineDeps {
		for dep, via := range moduleImports(t, pkg) {
			if !slices.Contains(allowed, dep) {
				t.Errorf("%s reaches %s (through %s): the engine and the plumbing know no policy; pass what they need as arguments or callbacks instead", pkg, dep, via)
			}
		}
	}
}

// moduleImports returns every package of the module pkg imports, directly
// or not, each with the package that imports it (the way it is reached).
func moduleImports(t *testing.T, pkg string) map[string]string {
	t.Helper()
	seen := map[string]string{}
	var walk func(p string)
	walk = func(p string) {
		for _, imp := range directImports(t, p) {
			rest, ok := strings.CutPrefix(imp, module)
			if !ok {
				continue
			}
			if _, done := seen[rest]; done {
				continue
			}
			seen[rest] = p
			walk(rest)
		}
	}
	walk(pkg)
	return seen
}

// directImports lists the imports of the non-test files of the module's
// package p (a path below the module root).
func directImports(t *testing.T, p string) []string {
	t.Helper()
	dir := filepath.Join("..", "..", filepath.FromSlash(p))
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			s, _ := strconv.Unquote(imp.Path.Value)
			out = append(out, s)
		}
	}
	return out
}
