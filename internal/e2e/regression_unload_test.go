package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestRegression_AdminUnloadIsOneActionAcrossEdgeRestarts: an admin
// unload is one action, not a mark an edge remembers. A kept model
// (keep_loaded 1) an admin unloads is loaded again by keep_loaded's rule;
// a model nothing keeps stays unloaded; and an edge restarted over the
// same model server decides the same: it loads nothing more and the
// unloaded model stays unloaded. The edge used to remember the unload in
// memory: the kept model stayed unloaded until the edge restarted, and
// then came back.
func TestRegression_AdminUnloadIsOneActionAcrossEdgeRestarts(t *testing.T) {
	harness.Parallel(t)
	s, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"x", "y"}, MaxLoadedModels: 2,
		LoadTime: 50 * time.Millisecond, DefaultMaxTokens: 2})
	cfg := harness.EdgeConfig(map[string]edge.ModelConfig{"kept": {Targets: []string{"x"}, KeepLoaded: 1}})
	c := &http.Client{}
	t.Cleanup(c.CloseIdleConnections)

	// start runs an edge and a node of the simulator until the returned
	// stop; it returns the edge's base URL.
	start := func() (string, func()) {
		ctx, cancel := context.WithCancel(context.Background())
		e := harness.Edge(t, ctx, cfg)
		nctx, stopNode := context.WithCancel(ctx)
		harness.Node(t, nctx, node.Config{NodeID: "node-1", Edge: e.NodeAddr, DiscoveryInterval: time.Hour, Providers: []node.ProviderConfig{
			{ID: "a", Type: node.TypeOllama, BaseURL: simURL, Models: []string{"x", "y"}, Capacity: 2, MaxLoadedModels: 2}}})
		return "http://" + e.HTTPAddr, func() {
			stopNode()
			e.Drain("restart")
			if err := e.Wait(); err != nil {
				t.Errorf("edge: %v", err)
			}
			cancel()
		}
	}
	loaded := func(base string) map[string]bool {
		t.Helper()
		resp, err := c.Get(base + "/api/ps")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Models []struct {
				Name string `json:"name"`
			} `json:"models"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, l := range out.Models {
			m[l.Name] = true
		}
		return m
	}
	admin := func(base, action, model string) {
		t.Helper()
		if status, body := postTo(t, c, base+"/admin/v1/providers/node-1/a/"+action, `{"model":"`+model+`"}`); status != http.StatusOK {
			t.Fatalf("admin %s %s: %d %s", action, model, status, body)
		}
	}

	base, stop := start()
	testenv.Eventually(t, "the kept model loaded", func() bool { return s.Stats().Loads == 1 && loaded(base)["x"] })
	admin(base, "load", "y")
	testenv.Eventually(t, "y loaded by the admin", func() bool { return s.Stats().Loads == 2 && loaded(base)["y"] })

	admin(base, "unload", "x")
	testenv.Eventually(t, "the kept model loaded again by keep_loaded after its admin unload", func() bool {
		st := s.Stats()
		return st.Unloads == 1 && st.Loads == 3 && loaded(base)["x"]
	})
	admin(base, "unload", "y")
	testenv.Eventually(t, "y unloaded", func() bool { return s.Stats().Unloads == 2 && !loaded(base)["y"] })

	stop()
	base, stop = start()
	defer stop()
	testenv.Eventually(t, "the restarted edge to read x loaded", func() bool { return loaded(base)["x"] })
	// A request through the restarted edge: the keeper has had the node's
	// readings, and the request's own reading follows its run.
	if status, body := postTo(t, c, base+"/api/chat", `{"model":"kept","stream":false,"messages":[{"role":"user","content":"hi"}]}`); status != http.StatusOK {
		t.Fatalf("kept through the restarted edge: %d %s", status, body)
	}
	if st := s.Stats(); st.Loads != 3 || st.Unloads != 2 {
		t.Fatalf("after the edge restart the simulator counts %d loads, %d unloads; want 3 and 2 (nothing loaded or unloaded again)", st.Loads, st.Unloads)
	}
	if l := loaded(base); l["y"] || !l["x"] {
		t.Fatalf("after the edge restart /api/ps lists %v, want x alone", l)
	}
}
