package process

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"iop/internal/configschema"
	"iop/internal/edge"
)

// TestConfigReferenceReloadColumn: the reference's reload column says what
// a running edge does. Each top-level key and section key of the edge file
// is set to its example and the running edge reloads: a key marked yes is
// not among the settings the edge says need a restart; a key marked
// restart is. The keys of the edge's own providers (providers,
// local_node_id) go to edgeProcess's localRestart instead; the other
// process parts' to EdgeFile.restartOnly, the core's to edge's Reload.
func TestConfigReferenceReloadColumn(t *testing.T) {
	t.Parallel()
	k, err := ConfigKind(KindEdge)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := edge.NewServer(edge.DefaultConfig(), edge.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	svc := srv.Service()
	k.Root.Walk(func(n *configschema.Node) {
		if n.Type == configschema.Section || strings.ContainsAny(n.Path, "[*") || strings.HasPrefix(n.Path, "cluster.") {
			return
		}
		if n.Path == "providers" || n.Path == "local_node_id" {
			if k.Reload(n) != "restart" {
				t.Errorf("%s: the reference says it reloads; the edge's own providers apply at the next start", n.Path)
			}
			if got := (&edgeProcess{}).localRestart(yamlEdgeFile(t, k.Example(n), n.Path)); len(got) != 1 || got[0] != n.Path {
				t.Errorf("%s: set to its example, the reload names %v as needing a restart", n.Path, got)
			}
			return
		}
		parts := strings.Split(n.Path, ".")
		var b strings.Builder
		for i, p := range parts[:len(parts)-1] {
			b.WriteString(strings.Repeat("  ", i) + p + ":\n")
		}
		b.WriteString(strings.Repeat("  ", len(parts)-1) + k.Example(n) + "\n")
		file := DefaultEdgeFile()
		if err := yaml.Unmarshal([]byte(b.String()), &file); err != nil {
			t.Errorf("%s: %v", n.Path, err)
			return
		}
		switch n.Path {
		case "tls_cert", "tls_key", "client_ca":
			file.TLSCert, file.TLSKey = "/etc/iop/edge.crt", "/etc/iop/edge.key"
		}
		res, err := svc.Reload(file.Config)
		if err != nil {
			t.Errorf("%s: reload of its example refused: %v", n.Path, err)
			return
		}
		res.Restart = append(res.Restart, DefaultEdgeFile().restartOnly(file)...)
		reported := len(res.Restart) > 0
		switch {
		case k.Reload(n) == "yes" && reported:
			t.Errorf("%s: the reference says it reloads; the edge says it needs a restart (%v)", n.Path, res.Restart)
		case k.Reload(n) == "restart" && !reported:
			t.Errorf("%s: the reference says restart; the edge applied it on a reload (or did not say)", n.Path)
		}
		if _, err := svc.Reload(edge.DefaultConfig()); err != nil {
			t.Fatal(err)
		}
	})
}

// yamlEdgeFile is the edge file of one top-level key, set as example
// ("key: value") says.
func yamlEdgeFile(t *testing.T, example, key string) EdgeFile {
	t.Helper()
	f := EdgeFileDefaults()
	if err := yaml.Unmarshal([]byte(example+"\n"), &f); err != nil {
		t.Fatalf("%s: %v", key, err)
	}
	return f
}
