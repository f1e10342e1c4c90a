package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/node/managed"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestKeepLoadedE2E: an edge with models.kept.keep_loaded 1, a node, and
// a simulated Ollama that holds one model at a time. Before any request
// the edge has the node load x (the simulator counts one load) and
// /api/ps lists it on that provider with when it was loaded. The node
// restarts while its server lost the model: the edge loads it again. An
// admin unload is one action: keep_loaded loads the model again.
func TestKeepLoadedE2E(t *testing.T) {
	harness.Parallel(t)
	ctx := t.Context()
	cfg := harness.EdgeConfig(map[string]edge.ModelConfig{"kept": {Targets: []string{"x"}, KeepLoaded: 1}})
	e := harness.Edge(t, ctx, cfg)
	s, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"x", "y"}, MaxLoadedModels: 1,
		LoadTime: 50 * time.Millisecond, DefaultMaxTokens: 2})
	ncfg := node.Config{NodeID: "node-1", Edge: e.NodeAddr, DiscoveryInterval: time.Hour, Providers: []node.ProviderConfig{
		{ID: "a", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"x", "y"}, Capacity: 2, MaxLoadedModels: 1}}}
	nctx, stopNode := context.WithCancel(ctx)
	harness.Node(t, nctx, ncfg)
	c := &http.Client{}
	t.Cleanup(c.CloseIdleConnections)
	base := "http://" + e.HTTPAddr

	type psModel struct {
		Name        string `json:"name"`
		NodeID      string `json:"node_id"`
		ProviderID  string `json:"provider_id"`
		LoadedSince string `json:"loaded_since"`
		Kept        bool   `json:"kept"`
	}
	ps := func() []psModel {
		t.Helper()
		resp, err := c.Get(base + "/api/ps")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Models []psModel `json:"models"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out.Models
	}
	listsX := func() bool {
		for _, m := range ps() {
			if m.Name == "x" && m.NodeID == "node-1" && m.ProviderID == "a" && m.LoadedSince != "" && m.Kept {
				return true
			}
		}
		return false
	}

	testenv.Eventually(t, "the kept model loaded before any request", func() bool { return s.Stats().Loads == 1 && listsX() })

	// The node restarts while its server lost the model.
	stopNode()
	testenv.Eventually(t, "the node gone", func() bool { return len(e.Service.Snapshot().Providers) == 0 })
	status, body := postTo(t, c, simURL+"/api/generate", `{"model":"x","keep_alive":0,"stream":false}`)
	if status != http.StatusOK || s.Stats().Unloads != 1 {
		t.Fatalf("unloading x on the simulator: %d %s", status, body)
	}
	harness.Node(t, ctx, ncfg)
	testenv.Eventually(t, "the kept model loaded again after the node restart", func() bool { return s.Stats().Loads == 2 && listsX() })

	// An admin unload is one action: /api/ps drops it, and keep_loaded
	// loads it again (the provider has room).
	req, err := http.NewRequest(http.MethodPost, base+"/admin/v1/providers/node-1/a/unload", strings.NewReader(`{"model":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), `"unloaded"`) {
		t.Fatalf("admin unload: %d %s", resp.StatusCode, answer)
	}
	testenv.Eventually(t, "the unloaded kept model loaded again", func() bool {
		st := s.Stats()
		return st.Unloads == 2 && st.Loads == 3 && listsX()
	})

	// An admin load of a model the provider does not serve: 404.
	status, body = postTo(t, c, base+"/admin/v1/providers/node-1/a/load", `{"model":"z"}`)
	if status != http.StatusNotFound {
		t.Fatalf("admin load of an unserved model: %d %s", status, body)
	}
}

// TestDashboardShowsResidency opens /ui in headless Chromium with a kept
// model loaded on a simulated Ollama: the provider's card lists it as
// loaded, kept, with how long since.
func TestDashboardShowsResidency(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"x", "y"}, MaxLoadedModels: 1, LoadTime: time.Millisecond})
	ctx := t.Context()
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"kept": {Targets: []string{"x"}, KeepLoaded: 1}}))
	harness.Node(t, ctx, node.Config{NodeID: "n1", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "a", Type: node.TypeOllama, BaseURL: url, Models: []string{"x", "y"}, MaxLoadedModels: 1}}})
	testenv.Eventually(t, "x loaded", func() bool {
		for _, m := range e.Service.Loaded() {
			if m.Served == "x" && m.Source == "reported" {
				return true
			}
		}
		return false
	})

	page := harness.Tab(t, 800, 600, 90*time.Second)
	if err := chromedp.Do(page, chromedp.Navigate("http://"+e.HTTPAddr+"/ui")); err != nil {
		t.Fatal(err)
	}
	const shown = `(() => { const l = document.querySelector('[data-provider="n1/a"] .loaded');
		return l !== null && l.querySelector('b[data-model="x"]') !== null && l.textContent.includes("kept") && l.textContent.includes("ago"); })()`
	if _, err := chromedp.Run(page, chromedp.Poll[bool](shown, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		text, _ := chromedp.Run(page, chromedp.Evaluate[string]("document.body.innerText"))
		t.Fatalf("the page never showed x loaded and kept on n1/a: %v\npage text:\n%s", err, text)
	}
}

// TestKeepLoadedManagedE2E: keep_loaded on a managed provider (its
// servers `iop sim` processes the node starts): the edge has the node
// start the kept model's server before any request, /api/ps lists it
// kept, and an admin unload stops that server.
func TestKeepLoadedManagedE2E(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t)
	ctx := t.Context()
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"a": {Targets: []string{"model-a"}, KeepLoaded: 1}}))
	server := managed.Server{
		Cmd:       []string{bin, "sim", "--protocol", "openai", "--listen", "127.0.0.1:${PORT}", "--model", "${MODEL}"},
		HealthURL: "http://127.0.0.1:${PORT}/v1/models",
		TTL:       time.Hour,
	}
	harness.Node(t, ctx, node.Config{NodeID: "gpu", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "mg", Type: node.TypeManaged, Capacity: 2, MaxLoadedModels: 1,
			Servers: map[string]managed.Server{"model-a": server, "model-b": server}}}})
	kept := func() bool {
		for _, m := range e.Service.Loaded() {
			if m.Served == "model-a" && m.ProviderID == "mg" && m.Source == "reported" && m.Kept {
				return true
			}
		}
		return false
	}
	testenv.Eventually(t, "the kept model's server started before any request", kept)
	c := &http.Client{}
	t.Cleanup(c.CloseIdleConnections)
	status, body := postTo(t, c, "http://"+e.HTTPAddr+"/admin/v1/providers/gpu/mg/unload", `{"model":"model-a"}`)
	if status != http.StatusOK {
		t.Fatalf("admin unload: %d %s", status, body)
	}
	testenv.Eventually(t, "the unloaded model's server gone from /api/ps", func() bool { return !kept() })
}
