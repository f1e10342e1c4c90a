package process

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/spf13/pflag"
	"gopkg.in/yaml.v3"

	"iop/internal/configschema"
	"iop/internal/node"
)

// TestConfigCheckMessages checks iop check's words for bad files of each
// kind: what is wrong, where (line:column), and the fix when there is one.
func TestConfigCheckMessages(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, kind, file string
		want             []string
	}{
		{"duration without unit", KindEdge, "queue:\n  queue_timeout: 30\n",
			[]string{`2:18: queue.queue_timeout: "30" is not a duration; write "30s"`}},
		{"duration in words", KindNode, "node_id: n\nedge: e:1\nproviders:\n  - type: ollama\n    timeout: 5 minutes\n",
			[]string{`5:14: providers[0].timeout: "5 minutes" is not a duration; write a number and a unit, such as "30s", "1m30s" or "500ms"`}},
		{"misspelled key", KindNode, "node_id: n\nedge: e:1\nproviders:\n  - type: ollama\n    capcity: 2\n",
			[]string{`5:5: unknown key "capcity" in providers[0]; did you mean "capacity"?`}},
		{"misspelled top key", KindEdge, "modles:\n  chat: {targets: [m]}\n",
			[]string{`1:1: unknown key "modles"; did you mean "models"?`}},
		{"dashes for underscores", KindEdge, "node-listen: 127.0.0.1:7070\n",
			[]string{`1:1: unknown key "node-listen"; did you mean "node_listen"?`}},
		{"key at the wrong level", KindNode, "node_id: n\nedge: e:1\ncapacity: 2\nproviders: [{type: ollama}]\n",
			[]string{`3:1: unknown key "capacity"; it belongs at providers[].capacity`}},
		{"unknown key, nothing near", KindDev, "colour: blue\n",
			[]string{`1:1: unknown key "colour"; the keys here are listen, node_listen, sim, ollama_url, discovery_interval, sim_capacity, sim_tokens_per_second, sim_ttft, ...`}},
		{"quoted number", KindEdge, "queue:\n  max_queue: \"16\"\n",
			[]string{`2:14: queue.max_queue: "16" is quoted, so it is text; write 16`}},
		{"not a number", KindDev, "sim_capacity: lots\n",
			[]string{`1:15: sim_capacity: "lots" is not a whole number`}},
		{"fraction for an integer", KindDev, "sim_capacity: 2.5\n",
			[]string{`1:15: sim_capacity: "2.5" is not a whole number`}},
		{"not a boolean", KindEdge, "insecure_open: maybe\n",
			[]string{`1:16: insecure_open: "maybe" is not true or false`}},
		{"scalar for a list", KindEdge, "models:\n  chat:\n    targets: tiny\n",
			[]string{`3:14: models.chat.targets: want a list, such as [a, b], not "tiny"`}},
		{"list for a section", KindEdge, "queue: [1, 2]\n",
			[]string{`1:8: queue: want a section of keys (max_queue, queue_timeout, reconnect_grace, batch), not a list`}},
		{"repeated key", KindEdge, "listen: a:1\nlisten: b:2\n",
			[]string{`2:1: key "listen" is repeated (first at line 1)`}},
		{"token's misspelled key", KindEdge, "tokens:\n  - plain\n  - {token: x, node: [a]}\n",
			[]string{`3:16: unknown key "node" in tokens[1]; did you mean "nodes"?`}},
		{"several problems, in file order", KindEdge, "insecure_open: maybe\nqueue:\n  queue_timeout: 1\n",
			[]string{`1:16: insecure_open: "maybe" is not true or false`, `3:18: queue.queue_timeout: "1" is not a duration; write "1s"`}},
		{"not YAML", KindEdge, "listen: [\n",
			[]string{`2:1: not YAML: did not find expected node content`}},
		{"validate: an alias without targets, at its line", KindEdge, "listen: 127.0.0.1:8080\nmodels:\n  chat: {max_queue: 3}\n",
			[]string{`3:3: models.chat: no targets`}},
		// Regression: a key's and a team's problems had no line (the
		// "invalid key: " prefix hid the path they name).
		{"validate: a key's problem, at its line", KindEdge, "listen: 127.0.0.1:8080\nkeys:\n  - {name: a, hash: \"sha256:" + strings.Repeat("a", 64) + "\"}\n  - {name: b, hash: \"sha256:" + strings.Repeat("a", 64) + "\"}\n",
			[]string{`4:5: keys[1] (b): the same hash as another key`}},
		{"validate: a team's problem, at its line", KindEdge, "listen: 127.0.0.1:8080\nkeys:\n  - {name: a, hash: \"sha256:" + strings.Repeat("a", 64) + "\"}\nteams:\n  - {name: t, quota: {tokens_per_day: -1}}\n",
			[]string{`5:5: teams[0] (t): invalid quota: tokens_per_day -1 is not a limit (0 = none)`}},
		{"validate: a node without an edge", KindNode, "node_id: n\nproviders: [{type: ollama}]\n",
			[]string{`edge or edges is required`}},
		{"scalar form of a section", KindEdge, "fairness: off\ntokens: [plain]\n", nil},
		{"empty file", KindNode, "", []string{`node_id is required`, `edge or edges is required`, `at least one provider is required`}},
		{"empty edge file is the defaults", KindEdge, "", nil},
		{"yes is a boolean", KindDev, "sim: yes\n", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k, err := ConfigKind(c.kind)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range CheckConfig(k, []byte(c.file)) {
				got = append(got, p.String())
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("problems of\n%s\n got %q\nwant %q", c.file, got, c.want)
			}
		})
	}
}

// TestRegression_ConfigLoadErrorsInConfigWords: iop edge, node and dev
// loading a bad file said `field capcity not found in type
// node.ProviderConfig` and `cannot unmarshal !!int `30` into
// time.Duration`, naming Go types. They now say what iop check says, with
// the file, line and column.
func TestRegression_ConfigLoadErrorsInConfigWords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name string
		cfg  any
		file string
		want string
	}{
		{"edge", new(EdgeFileDefaults()), "queue:\n  queue_timeout: 30\n", `edge.yaml:2:18: queue.queue_timeout: "30" is not a duration; write "30s"`},
		{"node", new(node.Config), "node_id: n\nproviders:\n  - type: ollama\n    capcity: 2\n", `node.yaml:4:5: unknown key "capcity" in providers[0]; did you mean "capacity"?`},
		{"dev", new(DevDefaults()), "sim_ttft: 150\napi-key: k\n", `dev.yaml:1:11: sim_ttft: "150" is not a duration; write "150s"` + "\n" + filepath.Join(dir, "dev.yaml") + `:2:1: unknown key "api-key"; did you mean "api_key"?`},
	}
	for _, c := range cases {
		path := filepath.Join(dir, c.name+".yaml")
		if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
			t.Fatal(err)
		}
		err := LoadConfig(pflag.NewFlagSet(c.name, pflag.ContinueOnError), path, c.cfg, nil)
		if err == nil {
			t.Fatalf("%s: a bad file loaded", c.name)
		}
		msg := err.Error()
		if !strings.HasSuffix(msg, c.want) || !strings.HasPrefix(msg, dir) {
			t.Errorf("%s: load error\n%s\nwant it to be the file's path and\n%s", c.name, msg, c.want)
		}
		for _, goWords := range []string{"not found in type", "unmarshal", "time.Duration", "process.", "node.Provider"} {
			if strings.Contains(msg, goWords) {
				t.Errorf("%s: load error names Go types (%q): %s", c.name, goWords, msg)
			}
		}
	}
}

// TestConfigDocsCoverEveryKey: every key of the edge, node and dev
// structs has its doc, a type, an example
// (but sections, whose keys have theirs), and a row in the reference; and
// no doc is left for a key that is gone.
func TestConfigDocsCoverEveryKey(t *testing.T) {
	t.Parallel()
	kinds, err := ConfigKinds()
	if err != nil {
		t.Fatal(err)
	}
	if len(configDocsMissing) > 0 {
		t.Errorf("configDocs (internal/process/configdocs.go) lacks %s", strings.Join(configDocsMissing, ", "))
	}
	ref, err := ConfigReference()
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, k := range kinds {
		k.Root.Walk(func(n *configschema.Node) {
			if n.Doc.Text == "" {
				t.Errorf("%s: %s has no text", k.Name, n.Path)
			}
			if n.Type != configschema.Section && k.Example(n) == "" {
				t.Errorf("%s: %s has no example", k.Name, n.Path)
			}
			if !bytes.Contains(ref, []byte("| `"+n.Path+"` |")) {
				t.Errorf("%s: %s has no row in the reference", k.Name, n.Path)
			}
		})
		markUsed(reflect.TypeOf(k.Defaults), used)
	}
	for key := range configDocs {
		if !used[key] {
			t.Errorf("configDocs[%q] documents no key of any config struct", key)
		}
	}
}

// markUsed notes every "pkg.Type.key" and "pkg.Type" reachable from t.
func markUsed(t reflect.Type, used map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || used[t.String()] {
		return
	}
	used[t.String()] = true
	for i := 0; i < t.NumField(); i++ {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if t.Field(i).Anonymous && opts == "inline" {
			markUsed(t.Field(i).Type, used)
			continue
		}
		if name != "" && name != "-" {
			used[t.String()+"."+name] = true
			markUsed(t.Field(i).Type, used)
		}
	}
}

// TestConfigReferenceIsCurrent: docs/config.md is what `go generate
// ./internal/process` writes from the structs and their docs.
func TestConfigReferenceIsCurrent(t *testing.T) {
	t.Parallel()
	want, err := ConfigReference()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/config.md is not current: run `go generate ./internal/process` (iop config doc -o docs/config.md)")
	}
}

// TestConfigExamplesCheck: the example files in docs/examples are valid
// files of their kind, as iop check guesses it from their names.
func TestConfigExamplesCheck(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../docs/examples/*.yaml")
	if err != nil || len(files) < 3 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		k, err := ConfigKind(GuessConfigKind(f, data))
		if err != nil {
			t.Fatal(err)
		}
		if ps := CheckConfig(k, data); len(ps) > 0 {
			t.Errorf("%s", &configschema.Problems{File: f, List: ps})
		}
	}
}

// TestConfigJSONSchemaMatchesCheck: the JSON Schema of iop config schema,
// compiled by a JSON Schema validator (draft 2020-12), accepts the example
// files and the files iop check accepts, and refuses a misspelled key and
// a duration without its unit, as iop check does.
func TestConfigJSONSchemaMatchesCheck(t *testing.T) {
	t.Parallel()
	cases := []struct {
		kind, file string
		ok         bool
	}{
		{KindEdge, "../../docs/examples/edge.yaml", true},
		{KindNode, "../../docs/examples/node.yaml", true},
		{KindDev, "../../docs/examples/dev.yaml", true},
		{KindEdge, "fairness: off\ntokens: [plain, {token: t, nodes: [a]}]\nqueue: {queue_timeout: 1m30s}\n", true},
		{KindEdge, "queue:\n  queue_timeout: 30\n", false},
		{KindNode, "node_id: n\nedge: e:1\nproviders: [{type: ollama, capcity: 2}]\n", false},
		{KindDev, "sim_capacity: lots\n", false},
	}
	for _, c := range cases {
		k, err := ConfigKind(c.kind)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := k.JSONSchema()
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		comp := jsonschema.NewCompiler()
		if err := comp.AddResource("iop-"+c.kind+".json", doc); err != nil {
			t.Fatal(err)
		}
		sch, err := comp.Compile("iop-" + c.kind + ".json")
		if err != nil {
			t.Fatalf("%s schema does not compile: %v", c.kind, err)
		}
		data := []byte(c.file)
		if strings.HasSuffix(c.file, ".yaml") {
			if data, err = os.ReadFile(c.file); err != nil {
				t.Fatal(err)
			}
		}
		// YAML to JSON values, as an editor's YAML language server does.
		var v any
		if err := yaml.Unmarshal(data, &v); err != nil {
			t.Fatal(err)
		}
		js, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
		if err != nil {
			t.Fatal(err)
		}
		verr := sch.Validate(inst)
		checkOK := len(CheckConfig(k, data)) == 0 || strings.HasSuffix(c.file, ".yaml")
		if (verr == nil) != c.ok || (c.ok && !checkOK) {
			t.Errorf("%s %q: JSON Schema says %v, want ok=%v", c.kind, c.file, verr, c.ok)
		}
	}
}

// TestRegression_KeyExpiresAtInTheEdgeConfig: `expires_at` on a key in the
// edge's own file (not its keys_file) was refused by iop check and by a
// reload: `keys[0].expires_at: want a section of keys (), not
// "2026-12-06T06:57:22Z"` (a time.Time was taken for a section).
func TestRegression_KeyExpiresAtInTheEdgeConfig(t *testing.T) {
	t.Parallel()
	k, err := ConfigKind(KindEdge)
	if err != nil {
		t.Fatal(err)
	}
	hash := `"sha256:` + strings.Repeat("a", 64) + `"`
	for _, c := range []struct {
		file string
		want []string
	}{
		{"keys:\n  - {name: bob, hash: " + hash + ", expires_at: \"2026-12-06T06:57:22Z\"}\n", nil},
		{"keys:\n  - {name: bob, hash: " + hash + ", expires_at: 2026-12-06T06:57:22Z}\n", nil},
		{"admin_keys:\n  - name: ops\n    hash: " + hash + "\n    expires_at: 2026-12-31T00:00:00+01:00\n", nil},
		{"keys:\n  - {name: bob, hash: " + hash + ", expires_at: tomorrow}\n",
			[]string{`2:` + fmt.Sprint(len("  - {name: bob, hash: "+hash+", expires_at: ")+1) + `: keys[0].expires_at: "tomorrow" is not an RFC 3339 time; write it as "2026-12-31T00:00:00Z"`}},
	} {
		var got []string
		for _, p := range CheckConfig(k, []byte(c.file)) {
			got = append(got, p.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("problems of\n%s\n got %q\nwant %q", c.file, got, c.want)
		}
	}
	s, err := k.JSONSchema()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(s), `"date-time"`) {
		t.Errorf("the JSON Schema gives expires_at no date-time format")
	}
}

// TestRegression_CheckRefusesAnOpenAPIOffLoopback: iop check passed an
// edge or dev file that the process then refused to start with (a client
// API without keys on a non-loopback address); it says the same now.
func TestRegression_CheckRefusesAnOpenAPIOffLoopback(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, kind, file string
		want             []string
	}{
		{"an open API off loopback", KindEdge, "listen: 0.0.0.0:8080\n",
			[]string{`refusing to serve the HTTP API on 0.0.0.0:8080 without API keys: anyone who can reach it could use your models. Add client keys (iop keys create NAME; keys: or keys_file: in the config), listen on a loopback address, or start with --insecure-open`}},
		{"an open API off loopback, meant", KindEdge, "listen: 0.0.0.0:8080\ninsecure_open: true\n", nil},
		{"an API off loopback with a keys file", KindEdge, "listen: 0.0.0.0:8080\nkeys_file: keys.yaml\n", nil},
		{"dev: an open API off loopback", KindDev, "listen: 0.0.0.0:8080\n",
			[]string{`no api_key: iop dev would refuse to serve the HTTP API on 0.0.0.0:8080 to anyone who can reach it. Set api_key, listen on a loopback address, or set insecure_open: true`}},
		{"dev: an API off loopback with a key", KindDev, "listen: 0.0.0.0:8080\napi_key: k\n", nil},
	}
	for _, c := range cases {
		k, err := ConfigKind(c.kind)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range CheckConfig(k, []byte(c.file)) {
			got = append(got, p.String())
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: problems of\n%s\n got %q\nwant %q", c.name, c.file, got, c.want)
		}
	}
}

// TestRegression_CheckPlacesProviderProblemsOnTheirLines: a node file's
// problems about a provider named by id (`provider "p1": type "tgi": ...`)
// came without a line; they now point at the key they name, or at the
// provider's entry.
func TestRegression_CheckPlacesProviderProblemsOnTheirLines(t *testing.T) {
	t.Parallel()
	k, err := ConfigKind(KindNode)
	if err != nil {
		t.Fatal(err)
	}
	file := "node_id: n1\nedge: 127.0.0.1:7001\nproviders:\n" +
		"  - id: a\n    type: ollama\n    base_url: http://127.0.0.1:11434\n    capacity: 1\n" +
		"  - id: \"p\\\"1\"\n    type: tgi\n    base_url: http://x\n    capacity: -1\n" +
		"  - id: p1\n    type: ollama\n    base_url: http://127.0.0.1:11434\n    capacity: 1\n    timeout: -1s\n"
	var got []string
	for _, p := range CheckConfig(k, []byte(file)) {
		got = append(got, p.String())
	}
	want := []string{
		`9:5: provider "p\"1": type "tgi": want ollama, openai, vllm, sim, cli or managed`,
		`11:5: provider "p\"1": capacity -1, long_capacity -1: must not be negative`,
		`16:5: provider "p1": timeout -1s: must not be negative`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems\n got %q\nwant %q", got, want)
	}
}
