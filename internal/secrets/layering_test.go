package secrets

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The decision is a pure function the proxy calls: the package must not
// reach into the proxy, the daemon or the configuration, or the proxy
// could not import it (and a test of it would need a daemon).
func TestSecretsImportsNoDataPlane(t *testing.T) {
	allowed := map[string]bool{"allowlist": true, "reqrules": true, "fsutil": true, "validate": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if rest, ok := strings.CutPrefix(p, "github.com/abox-dev/abox/internal/"); ok && !allowed[rest] {
				t.Errorf("%s imports %s: the secrets decision takes what it needs as arguments (Request, a value func) instead", f, p)
			}
		}
	}
}
