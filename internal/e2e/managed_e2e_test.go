package e2e

import (
	"context"
	"io"
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
	t.Parallel()
	bin := harness.IOP(t)
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
