package process

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// commentRulesRoot is the repository's root, from this package's directory.
const commentRulesRoot = "../.."

// maxDocGoLines bounds a doc.go: a package's doc is a map (what lives
// here, who owns what, the invariants one line each); the rules sit on the
// functions that enforce them.
const maxDocGoLines = 100

// historyInComment matches a comment that cites where a rule came from
// rather than stating it: an issue number, a break-it or tester's report,
// a new user's report. History belongs in commit messages.
var historyInComment = regexp.MustCompile(`(?i)\bissues? #?\d+|\bbreak-it\b|\b(a|the) tester('s)?\b|\bnew user's\b|\ba new user (saw|met|read|found|reported)\b|\bfound by a new user\b`)

// mayCiteHistory is a cheap test before historyInComment: whether comment
// holds one of the words the expression looks for (from their second
// letter, so either case of the first one matches).
func mayCiteHistory(comment string) bool {
	return strings.Contains(comment, "ssue") || strings.Contains(comment, "reak-it") ||
		strings.Contains(comment, "ester") || strings.Contains(comment, "ew user")
}

// commentRuleExceptions are the paths (slash-separated, from the root)
// not held to the rules: this file, whose comments name the words the
// rules look for.
var commentRuleExceptions = []*regexp.Regexp{
	regexp.MustCompile(`^internal/process/commentrules_test\.go$`),
}

// excepted reports whether path (from the root) is not yet held to the rules.
func excepted(path string) bool {
	for _, re := range commentRuleExceptions {
		if re.MatchString(path) {
			return true
		}
	}
	return false
}

// goFiles returns the repository's .go files (slash-separated paths from
// the root), leaving out node_modules, testdata and the excepted ones.
func goFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(commentRulesRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", "testdata", ".git":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		rel, err := filepath.Rel(commentRulesRoot, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if !excepted(rel) {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("no .go files found")
	}
	return out
}

// TestDocGoIsAMap: no doc.go is over maxDocGoLines lines.
func TestDocGoIsAMap(t *testing.T) {
	t.Parallel()
	for _, f := range goFiles(t) {
		if filepath.Base(f) != "doc.go" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(commentRulesRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(data), "\n"); n > maxDocGoLines {
			t.Errorf("%s: %d lines, want at most %d: keep the map, move each rule onto the function that enforces it", f, n, maxDocGoLines)
		}
	}
}

// TestCommentsStateRulesNotHistory: no comment of a .go file cites an
// issue number or a report as the source of a rule.
func TestCommentsStateRulesNotHistory(t *testing.T) {
	t.Parallel()
	for _, f := range goFiles(t) {
		file, err := os.Open(filepath.Join(commentRulesRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(file)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for n := 1; sc.Scan(); n++ {
			_, comment, ok := strings.Cut(sc.Text(), "//")
			if ok && mayCiteHistory(comment) && historyInComment.MatchString(comment) {
				t.Errorf("%s:%d: a comment cites history (%q): state the rule; history goes in the commit message", f, n, historyInComment.FindString(comment))
			}
		}
		if err := sc.Err(); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		file.Close()
	}
}
