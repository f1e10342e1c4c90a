package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/ollamatest"
	"iop/internal/process"
	"iop/internal/testenv"
)

// runnerStarts counts the models s loaded since its log's length was mark:
// Ollama's scheduler logs "loaded runners" once per model load.
func runnerStarts(s *ollamatest.Server, mark int) int {
	return strings.Count(s.LogSince(mark), `msg="loaded runners"`)
}

// TestRealOllama_ResidencyPair: two real Ollamas, each holding one model at
// a time (OLLAMA_MAX_LOADED_MODELS=1) of two tiny ones, x and y, behind one
// edge and one node. A client alternates between x and y, one request at
// a time, each sent once the node read its provider's /api/ps after the
// last. With residency off (least-loaded routing) every request goes to
// the first Ollama, and every alternation is a real unload and load there
// (its log counts a runner start per request; its /api/ps holds the model
// just asked for). With residency on, over the same Ollamas, each model
// is loaded at most once, on its own Ollama, and every later request goes
// where its model is loaded: the Ollamas' runner starts, their /api/ps and
// iop's residency readings (a new loaded_since is a load) agree.
func TestRealOllama_ResidencyPair(t *testing.T) {
	harness.ParallelOllama(t)
	const requests = 8
	var ollamas []*ollamatest.Server
	for range 2 {
		s := ollamatest.Start(t, "OLLAMA_MAX_LOADED_MODELS=1")
		s.CreateModel(t, "x", ollamatest.Plain)
		s.CreateModel(t, "y", ollamatest.Plain)
		ollamas = append(ollamas, s)
	}
	c := &http.Client{}
	t.Cleanup(c.CloseIdleConnections)

	// phase runs the alternation through a new edge (residency mode) and
	// node; it returns the Ollamas' runner starts during it, and the loads
	// iop's readings show (distinct provider, model, loaded_since).
	phase := func(mode string) (starts []int, readLoads int) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cfg := harness.EdgeConfig(nil)
		cfg.Routing = edge.RoutingLeastLoaded
		cfg.Residency = edge.ResidencyConfig{Mode: mode}
		e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge "+mode)})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			cancel()
			if err := e.Wait(); err != nil {
				t.Errorf("edge %s: %v", mode, err)
			}
		}()
		var provs []node.ProviderConfig
		marks := make([]int, len(ollamas))
		for i, s := range ollamas {
			provs = append(provs, node.ProviderConfig{ID: string(rune('a' + i)), Type: node.TypeOllama, BaseURL: s.URL,
				Models: []string{"x", "y"}, Capacity: 1, MaxLoadedModels: 1})
			marks[i] = len(s.Log())
		}
		nctx, stopNode := context.WithCancel(ctx)
		defer stopNode()
		harness.Node(t, nctx, node.Config{NodeID: "node-1", Edge: e.NodeAddr, Providers: provs})
		testenv.Eventually(t, "2 providers available", func() bool { return len(e.Service.Snapshot().Providers) == 2 })
		loads := map[string]bool{}
		for i := range requests {
			model := []string{"x", "y"}[i%2]
			status, body := postTo(t, c, "http://"+e.HTTPAddr+"/api/chat",
				fmt.Sprintf(`{"model":%q,"stream":false,"messages":[{"role":"user","content":"turn %d"}],"options":{"num_predict":2}}`, model, i))
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
			for _, m := range e.Service.Loaded() {
				if m.Source == "reported" {
					loads[m.ProviderID+"/"+m.Served+"/"+m.LoadedSince] = true
				}
			}
			if mode == edge.ResidencyOff {
				if got := ollamas[0].Running(t); !slices.Equal(got, []string{model + ":latest"}) {
					t.Fatalf("%s: request %d: the first Ollama holds %v, want %s alone (least-loaded routing sends every request there)", mode, i, got, model)
				}
			}
		}
		for i, s := range ollamas {
			starts = append(starts, runnerStarts(s, marks[i]))
		}
		return starts, len(loads)
	}

	off, offRead := phase(edge.ResidencyOff)
	if off[0] != requests || off[1] != 0 {
		t.Fatalf("residency off: runner starts %v, want %d on the first Ollama (one per request) and none on the second", off, requests)
	}
	if offRead != requests {
		t.Errorf("residency off: iop read %d loads, want %d", offRead, requests)
	}

	on, onRead := phase(edge.ResidencyOn)
	if total := on[0] + on[1]; total > 2 {
		t.Fatalf("residency on: runner starts %v, want at most one per model", on)
	}
	// The phase before left the first Ollama holding y: residency on loads
	// x on the second, once, and serves y where it is.
	if a, b := ollamas[0].Running(t), ollamas[1].Running(t); len(a) != 1 || len(b) != 1 || a[0] == b[0] {
		t.Fatalf("residency on: the Ollamas hold %v and %v, want one model each, not the same", a, b)
	}
	if onRead != 2 {
		t.Errorf("residency on: iop read %d (provider, model, loaded since) pairs, want 2: each model loaded once and kept", onRead)
	}
	t.Logf("runner starts: residency off %v, on %v; iop read loads: off %d, on %d", off, on, offRead, onRead)
}
