package process

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"gopkg.in/yaml.v3"

	"iop/internal/auth"
	"iop/internal/configschema"
	"iop/internal/edge"
	"iop/internal/node"
)

//go:generate go run ../../cmd/iop config doc -o ../../docs/config.md

// Config file kinds.
const (
	KindEdge = "edge"
	KindNode = "node"
	KindDev  = "dev"
)

// nodeDefaults is what `iop node` starts from before its file: the
// node-wide defaults (node.Config.Validate fills the same).
func nodeDefaults() node.Config {
	return node.Config{
		ResolveInterval:    node.DefaultResolveInterval,
		RuntimeConcurrency: 1,
		ReconnectMin:       node.DefaultReconnectMin,
		ReconnectMax:       node.DefaultReconnectMax,
		DrainTimeout:       node.DefaultDrainTimeout,
		DiscoveryInterval:  node.DefaultDiscoveryInterval,
	}
}

// configDocsMissing are the "pkg.Type.key" of config struct fields that
// configDocs lacks (TestConfigDocsCoverEveryKey demands none). A missing
// doc never stops a command: its key is still checked, with an empty text.
var configDocsMissing []string

var configKinds = sync.OnceValues(func() ([]configschema.Kind, error) {
	specs := []struct {
		name, command, intro string
		defaults             any
		reloads              bool
	}{
		{KindEdge, "iop edge --config edge.yaml", "The edge applies the keys marked *yes* on SIGHUP and whenever the file changes, to the next request; the others keep their running values until a restart, and the edge logs which.", EdgeFileDefaults(), true},
		{KindNode, "iop node --config node.yaml", "On SIGHUP a node reads its file again and applies the keys marked *yes* (providers' capacities and discovery intervals, the TLS files from the next connection); the others keep their running values until a restart, and the node logs which.", nodeDefaults(), true},
		{KindDev, "iop dev --config dev.yaml", "On SIGHUP `iop dev` reads its file again and applies the keys marked *yes*; the others keep their running values until a restart, and it logs which. Most keys are also flags (`sim_capacity` is `--sim-capacity`, `ollama_url` is `--ollama`); `iop dev --help` lists them.", DevDefaults(), true},
	}
	var kinds []configschema.Kind
	for _, s := range specs {
		root, missing, err := configschema.Build(reflect.TypeOf(s.defaults), configDocs)
		if err != nil {
			return nil, err
		}
		configDocsMissing = append(configDocsMissing, missing...)
		kinds = append(kinds, configschema.Kind{Name: s.name, Command: s.command, Intro: s.intro, Root: root, Defaults: s.defaults, Reloads: s.reloads})
	}
	return kinds, nil
})

// ConfigKinds returns the schemas of the edge, node and dev config files,
// built from EdgeFile, node.Config and DevConfig and their docs.
func ConfigKinds() ([]configschema.Kind, error) { return configKinds() }

// ConfigKind returns the kind named name ("edge", "node", "dev").
func ConfigKind(name string) (configschema.Kind, error) {
	kinds, err := configKinds()
	if err != nil {
		return configschema.Kind{}, err
	}
	for _, k := range kinds {
		if k.Name == name {
			return k, nil
		}
	}
	return configschema.Kind{}, fmt.Errorf("no config kind %q: want edge, node or dev", name)
}

// GuessConfigKind names the kind of the file at path from its name
// (edge.yaml, gpu-node.yaml, dev.yaml), else from its keys (node_id,
// edge or edges, or providers without an edge's listen, node_listen or
// models: node; sim or ollama_url: dev), else "edge".
func GuessConfigKind(path string, data []byte) string {
	base := strings.ToLower(filepath.Base(path))
	for _, k := range []string{KindEdge, KindNode, KindDev} {
		if strings.Contains(base, k) {
			return k
		}
	}
	var top map[string]any
	_ = yaml.Unmarshal(data, &top)
	for _, k := range []string{"node_id", "edges", "edge"} {
		if _, ok := top[k]; ok {
			return KindNode
		}
	}
	if _, ok := top["providers"]; ok {
		edgeKeys := false
		for _, k := range []string{"listen", "node_listen", "models", "local_node_id"} {
			_, has := top[k]
			edgeKeys = edgeKeys || has
		}
		if !edgeKeys {
			return KindNode
		}
	}
	for _, k := range []string{"sim", "ollama_url", "api_key"} {
		if _, ok := top[k]; ok {
			return KindDev
		}
	}
	return KindEdge
}

// CheckConfig returns the problems of a config file of kind k: first what
// does not fit the schema (unknown keys, wrong types; with lines), then,
// when it fits, what the kind's Validate finds (ranges, required keys),
// placed at the line of the key it names when it names one.
func CheckConfig(k configschema.Kind, data []byte) []configschema.Problem {
	if ps := configschema.Check(data, k.Root); len(ps) > 0 {
		return ps
	}
	var err error
	switch k.Name {
	case KindEdge:
		file := EdgeFileDefaults()
		if err = decodeYAMLStrict(data, &file); err == nil {
			err = file.Validate()
		}
		if err == nil && len(file.Keys) == 0 && file.KeysFile == "" {
			file.SetDefaults()
			err = checkOpenAPI(file, 0, slog.New(slog.DiscardHandler))
		}
	case KindNode:
		cfg := node.Config{}
		if err = decodeYAMLStrict(data, &cfg); err == nil {
			err = cfg.Validate()
		}
	case KindDev:
		cfg := DevDefaults()
		err = decodeYAMLStrict(data, &cfg)
		if err == nil && cfg.APIKey == "" && !isLoopback(cfg.Listen) && !cfg.InsecureOpen {
			err = fmt.Errorf("no api_key: iop dev would refuse to serve the HTTP API on %s to anyone who can reach it. Set api_key, listen on a loopback address, or set insecure_open: true", cfg.Listen)
		}
	}
	var out []configschema.Problem
	var doc yaml.Node
	if len(errorLines(err)) > 0 {
		_ = yaml.Unmarshal(data, &doc)
	}
	for _, msg := range errorLines(err) {
		line, col := lineOfPath(&doc, msg)
		out = append(out, configschema.Problem{Line: line, Column: col, Message: msg})
	}
	return out
}

func decodeYAMLStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// errorLines splits a joined error into its messages, without the
// sentinel prefixes ("invalid edge config: ") that say nothing to a
// reader of the file.
func errorLines(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(err.Error(), "\n") {
		for _, p := range []string{edge.ErrInvalidConfig.Error() + ": ", node.ErrInvalidConfig.Error() + ": ", auth.ErrInvalidKey.Error() + ": "} {
			l = strings.TrimPrefix(l, p)
		}
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

var leadingPath = regexp.MustCompile(`^([a-z_]+(\[\d+\])?(\.[A-Za-z0-9_:./-]+?)*)[ :]`)

// leadingProvider matches a node Validate message about a provider by
// id: `provider "p1": type "tgi": ...`, `provider "p1": capacity -1, ...`.
var leadingProvider = regexp.MustCompile(`^provider ("(?:[^"\\]|\\.)*"): ([a-z_]+)?`)

// lineOfPath finds the line and column of the key a Validate message
// starts with ("models.chat: no targets", "providers[1] (vllm): ...",
// `provider "p1": type ...`: the first provider of that id, at the key
// named after it when the entry has it) in the parsed file doc, or 0, 0.
func lineOfPath(doc *yaml.Node, msg string) (int, int) {
	if m := leadingProvider.FindStringSubmatch(msg); m != nil && len(doc.Content) > 0 {
		if id, err := strconv.Unquote(m[1]); err == nil {
			return lineOfProvider(doc.Content[0], id, m[2])
		}
	}
	m := leadingPath.FindStringSubmatch(msg)
	if m == nil || len(doc.Content) == 0 {
		return 0, 0
	}
	n := doc.Content[0]
	line, col := 0, 0
	for _, part := range strings.Split(m[1], ".") {
		name, idx := part, -1
		if i := strings.IndexByte(part, '['); i >= 0 {
			name = part[:i]
			fmt.Sscanf(part[i:], "[%d]", &idx)
		}
		found := false
		for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				line, col = n.Content[i].Line, n.Content[i].Column
				n, found = n.Content[i+1], true
				break
			}
		}
		if !found {
			break
		}
		if idx >= 0 && n.Kind == yaml.SequenceNode && idx < len(n.Content) {
			n = n.Content[idx]
			line, col = n.Line, n.Column
		}
	}
	return line, col
}

// checkLoad is what the commands run on their config file before decoding
// it: its schema problems, as one error that names the file and, for each
// problem, its line and column.
func checkLoad(path string, data []byte, v any) error {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	kinds, err := configKinds()
	if err != nil {
		// A struct the schema cannot map (TestConfigDocsCoverEveryKey
		// fails on it) leaves the file to yaml.v3's own checks.
		return nil
	}
	for _, k := range kinds {
		if reflect.TypeOf(k.Defaults) == t {
			if ps := configschema.Check(data, k.Root); len(ps) > 0 {
				return &configschema.Problems{File: path, List: ps}
			}
			return nil
		}
	}
	return nil // a type without a schema (iop sim's flags): decoded as is
}

// ConfigReference is docs/config.md: the reference of every key of every
// kind, generated from the schemas.
func ConfigReference() ([]byte, error) {
	kinds, err := configKinds()
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(referenceHead)
	for _, k := range kinds {
		fmt.Fprintf(&b, "\n## %s.yaml: `%s`\n\n%s\n\n", k.Name, k.Command, k.Intro)
		k.Table(&b)
	}
	b.WriteString(referenceTail)
	return b.Bytes(), nil
}

const referenceHead = `# Configuration reference

<!-- Generated by ` + "`go generate ./internal/process`" + ` (` + "`iop config doc`" + `) from the Go config
structs and internal/process/configdocs.go; edit those, not this file. -->

` + "`iop edge`, `iop node` and `iop dev`" + ` take ` + "`--config FILE`" + ` (YAML); flags override the
file. Examples of whole files are in [A real deployment](deployment.md) and
[Several edges](several-edges.md); ` + "`iop check FILE`" + ` checks one, and
` + "`iop config schema edge|node|dev`" + ` prints a JSON Schema for editors (for
example, with the YAML language server: ` + "`# yaml-language-server: $schema=edge.schema.json`" + `
as a file's first line).

Check the example files of [docs/examples](examples), and write the JSON
Schema of an edge file (a test runs this block):

` + "```sh runnable" + `
iop check docs/examples/edge.yaml docs/examples/node.yaml docs/examples/dev.yaml
iop config schema edge > edge.schema.json
` + "```" + `

Durations are written with a unit: ` + "`30s`, `1m30s`, `500ms`" + `. A key left out, or
given no value, takes its default. A path ` + "`models.*.targets`" + ` is the key
` + "`targets`" + ` of each entry of ` + "`models`" + `; ` + "`providers[].capacity`" + ` is the key ` + "`capacity`" + ` of each
item of the list ` + "`providers`" + `.
`

const referenceTail = `
## Reload

Every iop process handles ` + "`SIGHUP`" + ` the same way: it reads its file again,
applies the keys marked *yes* above, logs what it applied and what needs a
restart, and never exits on it. The edge also re-reads its ` + "`--config`" + ` file
whenever the file changes, and its ` + "`keys_file`" + ` on ` + "`SIGHUP`" + ` only. On the
edge, aliases, queue policies (with ` + "`reconnect_grace`" + `), API keys and their
limits, admin keys and node join tokens apply to the next request; requests
already queued or running keep theirs; a removed key gets 401 at once. A
file that does not parse or validate is refused with an error line naming
the problem, and the running config stays. A reload that would leave the
edge with no client ` + "`keys`" + ` (or no ` + "`admin_keys`" + `) while the running config has
some is refused the same way, unless the new file sets
` + "`insecure_open: true`" + `: a file read while half written never opens the API.
The file is read once it has stayed unchanged for 1 s; ` + "`SIGHUP`" + ` reads it at once.
`

// lineOfProvider is the line and column of key in the first entry of the
// mapping root's providers list whose id is id, or of the entry when it
// has no such key; 0, 0 when there is no such entry.
func lineOfProvider(root *yaml.Node, id, key string) (int, int) {
	providers := mappingValue(root, "providers")
	if providers == nil || providers.Kind != yaml.SequenceNode {
		return 0, 0
	}
	for _, item := range providers.Content {
		if v := mappingValue(item, "id"); v == nil || v.Value != id {
			continue
		}
		for i := 0; key != "" && i+1 < len(item.Content); i += 2 {
			if item.Content[i].Value == key {
				return item.Content[i].Line, item.Content[i].Column
			}
		}
		return item.Line, item.Column
	}
	return 0, 0
}

// mappingValue is the value of key in the mapping node n, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}
