package daemon

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"testing"
)

// The orchestration and the commands build no part of the data plane
// themselves: they describe it in a Config and call Run, so the wiring
// exists once.
func TestOnlyTheDaemonWiresTheDataPlane(t *testing.T) {
	forbidden := map[string]bool{}
	for _, p := range []string{"dnsfilter", "httpfilter", "upstream", "decisionlog"} {
		forbidden["github.com/abox-dev/abox/internal/"+p] = true
	}
	for _, dir := range []string{"../cli", "../instance"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, f := range files {
			af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if forbidden[p] {
					t.Errorf("%s imports %s: describe the data plane in daemon.Config instead", f, p)
				}
			}
		}
	}
}
