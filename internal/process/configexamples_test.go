package process

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

var updateExamples = flag.Bool("update-examples", false, "rewrite testdata/examples.golden.json from the example files")

// exampleConfig is one config file of the repo's, or one ```yaml block of
// its docs that is a whole file of some kind (it decodes into that kind).
type exampleConfig struct {
	name, kind string
	data       []byte
}

// exampleConfigs are the config files the repo shows users: docs/examples,
// deploy/compose, the node's testdata, and the ```yaml blocks of README.md
// and docs/*.md that are files of the kind iop check guesses for them.
func exampleConfigs(t *testing.T) []exampleConfig {
	t.Helper()
	var out []exampleConfig
	var files []string
	for _, g := range []string{"../../docs/examples/*.yaml", "../../deploy/compose/*.yaml", "../node/testdata/node.yaml"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, exampleConfig{name: strings.TrimPrefix(f, "../../"), kind: GuessConfigKind(f, data), data: data})
	}
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	for _, f := range append([]string{"../../README.md"}, docs...) {
		md, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllSubmatch(md, -1) {
			data := m[1]
			out = append(out, exampleConfig{name: fmt.Sprintf("%s#yaml%d", strings.TrimPrefix(f, "../../"), i), kind: GuessConfigKind("", data), data: data})
		}
	}
	return out
}

// loadExample decodes data as the command of kind does (LoadConfig's
// checks and strict decoding over the kind's defaults) and validates it;
// it returns the decoded file as JSON (the Go fields, flattened where
// embedded), or the load's error.
func loadExample(kind string, data []byte) (decoded map[string]any, loadErr, validErr error) {
	dir, err := os.MkdirTemp("", "example")
	if err != nil {
		return nil, err, nil
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, kind+".yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return nil, err, nil
	}
	fs := pflag.NewFlagSet(kind, pflag.ContinueOnError)
	var v any
	var validate func() error
	switch kind {
	case KindEdge:
		f := EdgeFileDefaults()
		v, validate = &f, func() error { return f.Validate() }
	case KindNode:
		c := nodeDefaults()
		v, validate = &c, func() error { return c.WithDefaults().Validate() }
	case KindDev:
		c := DevDefaults()
		v, validate = &c, func() error { return nil }
	}
	if err := LoadConfig(fs, path, v, nil); err != nil {
		return nil, err, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err, nil
	}
	if err := json.Unmarshal(b, &decoded); err != nil {
		return nil, err, nil
	}
	return decoded, nil, validate()
}

// TestExampleConfigsLoadUnchanged: every config file the repo shows users
// (exampleConfigs) loads into its kind's schema as it did when
// testdata/examples.golden.json was written: the same values in the same
// Go fields, valid or not as then. The files' keys never change for a
// change of the Go structs behind them; a doc block that is not a whole
// file of its kind (a fragment of another kind, a compose file) stays out.
// -update-examples rewrites the golden file.
func TestExampleConfigsLoadUnchanged(t *testing.T) {
	t.Parallel()
	type result struct {
		Kind    string         `json:"kind"`
		Valid   bool           `json:"valid"`
		Decoded map[string]any `json:"decoded"`
	}
	got := make(map[string]result)
	for _, ex := range exampleConfigs(t) {
		decoded, loadErr, validErr := loadExample(ex.kind, ex.data)
		if loadErr != nil {
			continue // not a whole file of its kind (a fragment, a compose file)
		}
		got[ex.name] = result{Kind: ex.kind, Valid: validErr == nil, Decoded: decoded}
	}
	const golden = "testdata/examples.golden.json"
	if *updateExamples {
		b, err := json.MarshalIndent(got, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	var want map[string]result
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		w := want[n]
		g, ok := got[n]
		if !ok {
			_, _, _ = loadExampleErr(t, n)
			t.Errorf("%s: no longer loads as a %s file", n, w.Kind)
			continue
		}
		if g.Kind != w.Kind || g.Valid != w.Valid {
			t.Errorf("%s: kind %s valid %v, want kind %s valid %v", n, g.Kind, g.Valid, w.Kind, w.Valid)
		}
		gb, _ := json.Marshal(g.Decoded)
		wb, _ := json.Marshal(w.Decoded)
		if !bytes.Equal(gb, wb) {
			t.Errorf("%s: decodes to\n%s\nwant\n%s", n, gb, wb)
		}
	}
	for n := range got {
		if _, ok := want[n]; !ok {
			t.Errorf("%s: a new example file: run go test -run TestExampleConfigsLoadUnchanged -update-examples ./internal/process/ and check the diff", n)
		}
	}
	if len(want) < 8 {
		t.Fatalf("only %d example files: the globs found too few", len(want))
	}
}

// loadExampleErr logs why the example named name no longer loads.
func loadExampleErr(t *testing.T, name string) (map[string]any, error, error) {
	for _, ex := range exampleConfigs(t) {
		if ex.name == name {
			d, l, v := loadExample(ex.kind, ex.data)
			t.Logf("%s: %v", name, l)
			return d, l, v
		}
	}
	return nil, nil, nil
}
