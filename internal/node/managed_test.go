package node

import (
	"os"
	"strings"
	"testing"

	"iop/internal/clock"
	"iop/internal/node/managed"
	"iop/internal/wire/nodev1"
)

// TestManagedProviderReportsItsServersAsLoaded: a managed provider says
// hello with nothing loaded (loaded_set), its max_loaded_models (default
// 1) and the tunnel path; a run starts its model's server (this test
// binary playing `iop sim`), is relayed to it, and the edge is told the
// model is loaded.
func TestManagedProviderReportsItsServersAsLoaded(t *testing.T) {
	e, addr := startEdge(t)
	srv := managed.Server{
		Cmd:       []string{os.Args[0], "--listen", "127.0.0.1:${PORT}", "--model", "${MODEL}"},
		Env:       map[string]string{envSimChild: "1"},
		HealthURL: "http://127.0.0.1:${PORT}/v1/models",
	}
	cfg := testConfig(addr, ProviderConfig{ID: "mg", Type: TypeManaged, Servers: map[string]managed.Server{"served-model": srv}})
	startAgent(t, cfg, clock.Real(), nil)
	c := connect(t, e, 1, hour)
	p := c.rawHello.GetProviders()[0]
	if !p.GetLoadedSet() || len(p.GetLoaded()) != 0 || p.GetMaxLoadedModels() != 1 ||
		p.GetExecutionPath() != nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL || strings.Join(p.GetModels(), ",") != "served-model" || !p.GetHealthy() {
		t.Fatalf("hello's provider %v", p)
	}
	c.send(t, inlineDispatchMsg("r1", "mg", tunnel, `{"model":"alias","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	r := recv(t, e.runs, "run stream")
	head, body, complete := tunnelAnswer(r.rest(t))
	if head.GetStatus() != 200 || !complete || !strings.Contains(body, "data: [DONE]") {
		t.Fatalf("answer %v %q complete %v", head, body, complete)
	}
	u := recv(t, c.loaded, "residency update")
	if loadedNames(u.GetLoaded()) != "served-model" || u.GetLoaded()[0].GetLoadedSince() == "" {
		t.Fatalf("update %v", u)
	}
}
