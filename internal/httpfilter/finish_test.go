package httpfilter

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// recordStandIns are the functions that make a record no line is written
// for, and why.
var recordStandIns = map[string]string{
	// ReverseProxy's error handler outside a forwarded request (it always
	// runs inside one, whose record its handler's deferred finish writes).
	"upstreamError": "a stand-in when the request's state is missing",
}

// TestEveryLineIsOneDeferredFinish holds the rule that makes a request's
// (or a tunnel's, or a refused connection's) decision line impossible to
// skip: finish is only ever called in a defer, and each function that
// makes a record defers finish of it itself, so no return, and no panic,
// between the two can leave it unwritten.
func TestEveryLineIsOneDeferredFinish(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	makers := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			deferred := map[*ast.CallExpr]bool{}
			finished := map[string]bool{} // records finish is deferred for
			made := map[string]token.Pos{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.DeferStmt:
					deferred[n.Call] = true
					if isFinish(n.Call) && len(n.Call.Args) == 1 {
						if id, ok := n.Call.Args[0].(*ast.Ident); ok {
							finished[id.Name] = true
						}
					}
				case *ast.AssignStmt:
					for i, rhs := range n.Rhs {
						if isRecordLit(rhs) && i < len(n.Lhs) {
							if id, ok := n.Lhs[i].(*ast.Ident); ok {
								made[id.Name] = rhs.Pos()
							}
						}
					}
				case *ast.CallExpr:
					if isFinish(n) && !deferred[n] {
						t.Errorf("%s: finish called outside a defer", fset.Position(n.Pos()))
					}
					for _, a := range n.Args {
						if isRecordLit(a) {
							t.Errorf("%s: a record made as an argument: make it a variable and defer its finish", fset.Position(a.Pos()))
						}
					}
				}
				return true
			})
			for name, pos := range made {
				if _, ok := recordStandIns[fd.Name.Name]; ok {
					continue
				}
				makers++
				if !finished[name] {
					t.Errorf("%s: %s makes record %s without defer p.finish(%s)", fset.Position(pos), fd.Name.Name, name, name)
				}
			}
		}
	}
	// serveOuterRequest, serveInner and guardRefused at least: a test that
	// finds none is looking at the wrong files.
	if makers < 3 {
		t.Fatalf("found %d functions that make a record, want at least 3", makers)
	}
}

func isFinish(c *ast.CallExpr) bool {
	s, ok := c.Fun.(*ast.SelectorExpr)
	if !ok || s.Sel.Name != "finish" {
		return false
	}
	switch x := s.X.(type) {
	case *ast.Ident: // p.finish
		return x.Name == "p"
	case *ast.SelectorExpr: // c.p.finish
		return x.Sel.Name == "p"
	}
	return false
}

func isRecordLit(e ast.Expr) bool {
	u, ok := e.(*ast.UnaryExpr)
	if !ok || u.Op != token.AND {
		return false
	}
	cl, ok := u.X.(*ast.CompositeLit)
	if !ok {
		return false
	}
	id, ok := cl.Type.(*ast.Ident)
	return ok && id.Name == "record"
}
