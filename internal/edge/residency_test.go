package edge

import (
	"slices"
	"testing"

	"iop/internal/wire/nodev1"
)

// TestResidencyReachesTheScheduler: an Ollama provider's loaded models
// (its server's names, mapped to served names) and its configured
// max_loaded_models go to the scheduler at the Hello, and a
// ProviderUpdate's new reading replaces them; a provider whose node reads
// none (OpenAI-compatible) has no residency (it holds every model).
func TestResidencyReachesTheScheduler(t *testing.T) {
	e := startEdge(t, testConfig())
	ol := prov("ol", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "a", "b")
	ol.Type = "ollama"
	ol.LoadedSet, ol.Loaded, ol.MaxLoadedModels = true, []*nodev1.LoadedModel{{Name: "a:latest"}, {Name: "other:latest"}}, 2
	oa := prov("oa", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, 1, "gpt")
	n := e.connect(t, hello("n1", ol, oa))
	r, ok := e.svc.sched.Residency("n1", "ol")
	if !ok || !slices.Equal(r.Held, []string{"a"}) || r.MaxLoaded != 2 {
		t.Fatalf("residency of ol: %+v %v, want a held, limit 2", r, ok)
	}
	if _, ok := e.svc.sched.Residency("n1", "oa"); ok {
		t.Fatal("an OpenAI-compatible provider has a residency")
	}
	n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{
		ProviderId: "ol", Healthy: true, LoadedSet: true, Loaded: []*nodev1.LoadedModel{{Name: "b:latest"}}}}})
	waitFor(t, func() bool {
		r, _ := e.svc.sched.Residency("n1", "ol")
		return slices.Equal(r.Held, []string{"b"}) && r.MaxLoaded == 2
	})
}
