package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestResidencyE2E: an edge, a node and two simulated Ollamas that hold
// one model at a time (--max-loaded-models 1), a client alternating
// between models x and y, one request at a time, each sent once the node
// reported what its provider holds after the last. Least-loaded routing
// sends every request to the first provider, which swaps each time;
// residency-aware routing loads each model once, on its own provider.
func TestResidencyE2E(t *testing.T) {
	harness.Parallel(t)
	const requests = 8
	loads := map[string]int64{}
	for _, mode := range []string{edge.ResidencyOn, edge.ResidencyOff} {
		ctx, cancel := context.WithCancel(context.Background())
		cfg := process.DefaultEdgeFile()
		cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Database = ":memory:"
		cfg.Routing = edge.RoutingLeastLoaded
		cfg.Residency = edge.ResidencyConfig{Mode: mode}
		e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
		if err != nil {
			t.Fatal(err)
		}
		harness.StopAtCleanup(t, cancel, e)
		var sims []*sim.Server
		var provs []node.ProviderConfig
		for _, id := range []string{"a", "b"} {
			s, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"x", "y"}, MaxLoadedModels: 1,
				LoadTime: 100 * time.Millisecond, DefaultMaxTokens: 2})
			sims = append(sims, s)
			provs = append(provs, node.ProviderConfig{ID: id, Type: node.TypeOllama, BaseURL: url, Models: []string{"x", "y"}, Capacity: 1})
		}
		harness.Node(t, ctx, node.Config{NodeID: "node-1", Edge: e.NodeAddr, Providers: provs})
		testenv.Eventually(t, "2 providers available", func() bool { return len(e.Service.Snapshot().Providers) == 2 })
		c := &http.Client{}
		t.Cleanup(c.CloseIdleConnections)
		for i := range requests {
			model := []string{"x", "y"}[i%2]
			status, body := postTo(t, c, "http://"+e.HTTPAddr+"/api/chat",
				fmt.Sprintf(`{"model":%q,"stream":false,"messages":[{"role":"user","content":"turn %d"}]}`, model, i))
			if status != http.StatusOK {
				t.Fatalf("%s: request %d: %d %s", mode, i, status, body)
			}
			testenv.Eventually(t, "the node reports "+model+" loaded", func() bool {
				for _, m := range e.Service.Loaded() {
					if m.Served == model && m.Source == "reported" {
						return true
					}
				}
				return false
			})
		}
		for _, s := range sims {
			st := s.Stats()
			loads[mode] += st.Loads
			if st.Rejected != 0 || st.MaxInFlight > 1 {
				t.Fatalf("%s: a simulator went over capacity: %+v", mode, st)
			}
		}
	}
	if loads[edge.ResidencyOn] != 2 || loads[edge.ResidencyOff] != requests {
		t.Fatalf("loads %v: want 2 with residency on, %d with it off", loads, requests)
	}
}
