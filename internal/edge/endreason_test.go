package edge

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestEveryEndReasonHasADocsLine: every EndReason is a snake_case word,
// listed once by EndReasons, with its row in docs/observability.md's table
// of end reasons; the table has no row for a reason that does not exist.
func TestEveryEndReasonHasADocsLine(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	word := regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)
	seen := make(map[EndReason]bool)
	for _, r := range EndReasons() {
		if !word.MatchString(string(r)) || seen[r] {
			t.Errorf("end reason %q: not a snake_case word, or listed twice", r)
		}
		seen[r] = true
		if !strings.Contains(string(doc), "\n| `"+string(r)+"` | ") {
			t.Errorf("end reason %q has no row in docs/observability.md", r)
		}
	}
	rows := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| the run ended|^\\| `([a-z_]+)` \\| (the|another)").FindAllStringSubmatch(string(doc), -1)
	for _, m := range rows {
		name := m[1] + m[2]
		if !seen[EndReason(name)] {
			t.Errorf("docs/observability.md has a row for %q, which is no EndReason", name)
		}
	}
	if len(rows) != len(seen) {
		t.Errorf("docs/observability.md has %d end reason rows, EndReasons %d", len(rows), len(seen))
	}
	// Every constant of type EndReason is in EndReasons.
	f, err := parser.ParseFile(token.NewFileSet(), "endreason.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := 0
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			if id, ok := vs.Type.(*ast.Ident); ok && id.Name == "EndReason" {
				for _, name := range vs.Names {
					consts++
					if !strings.HasPrefix(name.Name, "End") {
						t.Errorf("constant %s: an EndReason's name starts with End", name.Name)
					}
				}
			}
		}
		return true
	})
	if consts != len(seen) {
		t.Errorf("endreason.go declares %d EndReason constants, EndReasons lists %d", consts, len(seen))
	}
}
