package e2e

import (
	"bufio"
	"context"
	"fmt"
	"iop/internal/e2e/harness"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode"
)

// docsRoot is the repository's root, from this package's directory.
const docsRoot = "../.."

// docFiles are README.md and every markdown file under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{filepath.Join(docsRoot, "README.md")}
	more, err := filepath.Glob(filepath.Join(docsRoot, "docs", "*.md"))
	if err != nil || len(more) == 0 {
		t.Fatalf("docs/*.md: %v %v", more, err)
	}
	return append(files, more...)
}

// runnableBlock is one fenced block marked "```sh runnable" in a doc.
type runnableBlock struct {
	file string
	line int
	text string
}

func runnableBlocks(t *testing.T) []runnableBlock {
	t.Helper()
	var out []runnableBlock
	for _, f := range docFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cur *runnableBlock
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		for n := 1; sc.Scan(); n++ {
			l := sc.Text()
			switch {
			case cur == nil && strings.TrimSpace(l) == "```sh runnable":
				cur = &runnableBlock{file: f, line: n}
			case cur != nil && strings.TrimSpace(l) == "```":
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				cur.text += l + "\n"
			}
		}
		if cur != nil {
			t.Fatalf("%s:%d: runnable block never closed", f, cur.line)
		}
	}
	return out
}

var loopbackPort = regexp.MustCompile(`127\.0\.0\.1:(\d{2,5})`)

// freePorts replaces every 127.0.0.1:PORT of script with a port the
// system chose, the same port for the same number, so blocks written
// with the documented ports (8080, 7070, ...) run beside other tests.
func freePorts(t *testing.T, script string) string {
	t.Helper()
	chosen := map[string]string{}
	return loopbackPort.ReplaceAllStringFunc(script, func(m string) string {
		if a, ok := chosen[m]; ok {
			return a
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a := l.Addr().String()
		l.Close()
		chosen[m] = a
		return a
	})
}

// TestDocsRunnableBlocks runs every block of the docs marked "```sh
// runnable" with sh -eu, the iop binary of this tree first on PATH, in a
// directory that holds a copy of docs/examples, on free loopback ports:
// what the docs tell an operator to type works as written.
func TestDocsRunnableBlocks(t *testing.T) {
	t.Parallel() // its subtests take the slots
	blocks := runnableBlocks(t)
	if len(blocks) < 2 {
		t.Fatalf("found %d runnable blocks in the docs; want the config check and the one-machine tour at least", len(blocks))
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed; the docs' blocks use it")
	}
	bin := filepath.Dir(harness.IOP(t))
	examples, err := filepath.Glob(filepath.Join(docsRoot, "docs", "examples", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		b := b
		name := fmt.Sprintf("%s:%d", filepath.Base(b.file), b.line)
		t.Run(name, func(t *testing.T) {
			harness.Parallel(t)
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "docs", "examples"), 0o755); err != nil {
				t.Fatal(err)
			}
			for _, e := range examples {
				data, err := os.ReadFile(e)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "docs", "examples", filepath.Base(e)), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			script := freePorts(t, b.text)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, "sh", "-eu", "-c", script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
			cmd.WaitDelay = 10 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				logs := ""
				for _, l := range []string{"sim.log", "edge.log", "node.log"} {
					if data, rerr := os.ReadFile(filepath.Join(dir, l)); rerr == nil {
						logs += "\n--- " + l + "\n" + string(data)
					}
				}
				t.Fatalf("%s: %v\n--- script\n%s--- output\n%s%s", name, err, script, out, logs)
			}
		})
	}
}

// TestDocsLinks: every relative link of README.md and docs/*.md names a
// file that exists and, with a #fragment, a heading of that file.
func TestDocsLinks(t *testing.T) {
	harness.Parallel(t)
	fence := regexp.MustCompile("(?ms)^```.*?^```")
	heading := regexp.MustCompile(`(?m)^#+ (.*)$`)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		if data, err := os.ReadFile(path); err == nil {
			for _, m := range heading.FindAllStringSubmatch(fence.ReplaceAllString(string(data), ""), -1) {
				a[slug(m[1])] = true
			}
		}
		anchors[path] = a
		return a
	}
	for _, f := range docFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(fence.ReplaceAllString(string(data), ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			full := f
			if path != "" {
				full = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(full); err != nil {
				t.Errorf("%s: link %q: %v", f, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(full, ".md") && !anchorsOf(full)[frag] {
				t.Errorf("%s: link %q: no heading #%s in %s", f, target, frag, full)
			}
		}
	}
}

// slug is GitHub's anchor of a heading: lower case, punctuation dropped,
// spaces to hyphens.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
