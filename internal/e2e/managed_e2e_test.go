package e2e

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/node/managed"
	"iop/internal/testenv"
)

// privateIOP is a copy of the iop binary at a path of t's own, so that
// procsRunning counts only the processes t started from it (the shared
// binary also runs other tests' servers).
func privateIOP(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(harness.IOP(t))
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "iop")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// procsRunning counts the processes whose command line starts with bin.
func procsRunning(t *testing.T, bin string) int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, d := range dirs {
		data, err := os.ReadFile(d)
		if err == nil && strings.HasPrefix(string(data), bin+"\x00") {
			if stat, err := os.ReadFile(strings.TrimSuffix(d, "cmdline") + "stat"); err == nil {
				if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
					continue // a zombie has exited
				}
			}
			n++
		}
	}
	return n
}

// TestEndToEndManagedProvider: a node whose provider is of type managed,
// with two models whose servers are `iop sim` (the real binary) started
// on demand, one at a time (max_loaded_models 1). Requests alternating
// between the models are answered through the edge, each swap stopping
// the other server; the edge's /api/ps shows the model whose server runs;
// the node's shutdown leaves no server running.
func TestEndToEndManagedProvider(t *testing.T) {
	harness.Parallel(t)
	bin := privateIOP(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{
		"a": {Targets: []string{"model-a"}},
		"b": {Targets: []string{"model-b"}},
	}))
	server := managed.Server{
		Cmd:       []string{bin, "sim", "--protocol", "openai", "--listen", "127.0.0.1:${PORT}", "--model", "${MODEL}"},
		HealthURL: "http://127.0.0.1:${PORT}/v1/models",
		TTL:       time.Hour,
	}
	nodeCtx, stopNode := context.WithCancel(ctx)
	defer stopNode()
	harness.Node(t, nodeCtx, node.Config{
		NodeID: "gpu",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "mg", Type: node.TypeManaged, Capacity: 2,
			Servers: map[string]managed.Server{"model-a": server, "model-b": server}}},
	})
	client := newClient(e)
	for i, model := range []string{"a", "b", "a"} {
		resp, err := client.Chat.Completions.New(context.Background(), chatParams(model, "hello"))
		if err != nil {
			t.Fatalf("request %d for %s: %v", i, model, err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("request %d for %s: %+v", i, model, resp.Choices)
		}
		if n := procsRunning(t, bin); n != 1 {
			t.Fatalf("after request %d: %d servers running, want 1 (max_loaded_models 1)", i, n)
		}
	}
	testenv.Eventually(t, "/api/ps to show model-a alone", func() bool {
		resp, err := http.Get("http://" + e.HTTPAddr + "/api/ps")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), "model-a") && !strings.Contains(string(body), "model-b")
	})
	stopNode()
	testenv.Eventually(t, "the node's servers to stop with it", func() bool { return procsRunning(t, bin) == 0 })
}

// TestRegression_KeepLoadedLeavesADemandLoadAlone: an alias kept loaded
// (keep_loaded 1) with two targets on one managed provider that runs one
// model server at a time. Requests for the second target start its
// server once: the provider then holds the alias (any target counts), and
// the keeper neither loads the first target again nor, while the second
// one's server starts, stops it (a preload never evicts). The keeper
// restarted the first target after every such request, and each request
// for the second cost two model loads.
func TestRegression_KeepLoadedLeavesADemandLoadAlone(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{
		"mg": {Targets: []string{"ma", "mb"}, KeepLoaded: 1},
	}))
	server := managed.Server{
		Cmd:       []string{bin, "sim", "--protocol", "openai", "--listen", "127.0.0.1:${PORT}", "--model", "${MODEL}"},
		HealthURL: "http://127.0.0.1:${PORT}/v1/models",
		TTL:       time.Hour,
	}
	var nodeLog harness.Buffer
	harness.ShowOnFailure(t, "node", &nodeLog)
	agent, err := node.New(node.Config{NodeID: "gpu", Edge: e.NodeAddr, Providers: []node.ProviderConfig{{ID: "mg", Type: node.TypeManaged,
		Capacity: 2, MaxLoadedModels: 1, Servers: map[string]managed.Server{"ma": server, "mb": server}}}},
		slog.New(slog.NewJSONHandler(&nodeLog, nil)))
	if err != nil {
		t.Fatal(err)
	}
	nodeCtx, stopNode := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- agent.Run(nodeCtx) }()
	t.Cleanup(func() {
		stopNode()
		<-done
	})
	starts := func(model string) int {
		n := 0
		for _, l := range harness.JSONLines(t, nodeLog.String()) {
			if l["msg"] == "model server started" && l["model"] == model {
				n++
			}
		}
		return n
	}
	loaded := func(model string) bool {
		for _, p := range e.Service.Snapshot().Providers {
			for _, r := range p.Loaded {
				if r.Model == model {
					return true
				}
			}
		}
		return false
	}
	testenv.Eventually(t, "the keeper to load ma", func() bool { return loaded("ma") })
	client := newClient(e)
	for i := range 3 {
		if _, err := client.Chat.Completions.New(context.Background(), chatParams("mb", "hello")); err != nil {
			t.Fatalf("request %d for mb: %v", i, err)
		}
		testenv.Eventually(t, "mb read loaded", func() bool { return loaded("mb") })
	}
	if a, b := starts("ma"), starts("mb"); a != 1 || b != 1 {
		t.Fatalf("model server starts: ma %d, mb %d; want 1 each (the keeper's, then the demand's)", a, b)
	}
}
