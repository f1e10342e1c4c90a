package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"

	"iop/internal/e2e/harness"
)

// TestParallelTestsTakeASlot: every parallel test of the suite calls
// harness.Parallel, ParallelLong or ParallelOllama, which take one of
// -parallel's slots (harness.Main lifts go test's own limit); a t.Parallel
// is allowed only in a function that also starts subtests (t.Run), which
// take the slots. A test calling t.Parallel alone would run beside all the
// others, whatever -parallel says.
func TestParallelTestsTakeASlot(t *testing.T) {
	harness.Parallel(t)
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				body = fn.Body
			case *ast.FuncLit:
				body = fn.Body
			default:
				return true
			}
			if body == nil {
				return true
			}
			parallel, runs := calls(body, "Parallel"), calls(body, "Run")
			for _, p := range parallel {
				if len(runs) == 0 {
					t.Errorf("%s: t.Parallel() in a test that starts no subtest: call harness.Parallel(t)", fset.Position(p))
				}
			}
			return true
		})
	}
}

// calls lists the positions of calls t.<method>() in body, not looking
// into the function literals inside it.
func calls(body *ast.BlockStmt, method string) []token.Pos {
	var found []token.Pos
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == method {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "t" {
					found = append(found, n.Pos())
				}
			}
		}
		return true
	})
	return found
}
