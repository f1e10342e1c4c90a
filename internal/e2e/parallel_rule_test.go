package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
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

// TestOllamaTestsMatchTheMakefilesPattern: every test that calls
// harness.ParallelOllama (itself or in a subtest) has a name that
// E2E_OLLAMA, the Makefile's -run pattern, matches. make test runs those
// tests in a go test of their own, one at a time, beside the rest of the
// suite: a real-Ollama test left in the other one would run beside them,
// and two Ollama servers loading at once can pick the same runner port.
func TestOllamaTestsMatchTheMakefilesPattern(t *testing.T) {
	harness.Parallel(t)
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^E2E_OLLAMA \?= (.+)$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal("the Makefile sets no E2E_OLLAMA")
	}
	pattern, err := regexp.Compile(string(m[1]))
	if err != nil {
		t.Fatalf("E2E_OLLAMA: %v", err)
	}
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	found := 0
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil || !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "ParallelOllama" {
					found++
					if !pattern.MatchString(fn.Name.Name) {
						t.Errorf("%s: %s calls harness.ParallelOllama but E2E_OLLAMA (%s) does not match its name", fset.Position(call.Pos()), fn.Name.Name, pattern)
					}
				}
				return true
			})
		}
	}
	if found == 0 {
		t.Fatal("no test calls harness.ParallelOllama")
	}
}
