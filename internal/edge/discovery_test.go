package edge

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// Tests of what nodes that discover their providers' models send: per-model
// capabilities and details in Hello, and ProviderUpdates that replace the
// served models or change health.

func modelCaps(model string, caps ...string) *nodev1.ModelCapabilities {
	return &nodev1.ModelCapabilities{Model: model, Capabilities: caps}
}

func providerUpdate(u *nodev1.ProviderUpdate) *nodev1.NodeMessage {
	return &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: u}}
}

// setModels is the update a node sends when its provider's server lists
// models (healthy, served models replaced).
func setModels(provider string, models []string, caps ...*nodev1.ModelCapabilities) *nodev1.NodeMessage {
	return providerUpdate(&nodev1.ProviderUpdate{ProviderId: provider, Healthy: true, ModelsSet: true, Models: models, ModelCapabilities: caps})
}

func embedReq(model string) contract.Request {
	return contract.Request{Model: model, Operation: contract.OperationEmbeddings, Body: []byte(`{"model":"` + model + `","input":"x"}`), Needs: []string{"embeddings"}}
}

func toolsReq(model string) contract.Request {
	r := chatReq(model)
	r.Needs = []string{"tools"}
	return r
}

// waitModels waits until the edge lists want among its models (and none of
// gone).
func (e *testEdge) waitModels(t *testing.T, want, gone []string) {
	t.Helper()
	e.waitUntil(t, "models listed", func(contract.Snapshot) bool {
		models := e.svc.Models()
		for _, m := range want {
			if !slices.Contains(models, m) {
				return false
			}
		}
		for _, m := range gone {
			if slices.Contains(models, m) {
				return false
			}
		}
		return true
	})
}

// TestProviderUpdateReplacesServedModels: a models_set update replaces what
// the provider serves: a model pulled after Hello is listed and dispatched
// to, a removed one is no longer listed and has no provider; an update
// without models_set leaves the served models alone.
func TestProviderUpdateReplacesServedModels(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 2, "old")))
	n.send(t, setModels("p1", []string{"new", "old"}))
	e.waitModels(t, []string{"new", "old"}, nil)
	_, _, d := e.startRun(t, n, chatReq("new"))
	if d.GetProviderId() != "p1" || d.GetServedModel() != "new" {
		t.Fatalf("dispatch %v", d)
	}

	n.send(t, setModels("p1", []string{"new"}))
	e.waitModels(t, []string{"new"}, []string{"old"})
	if _, err := e.svc.Dispatch(context.Background(), chatReq("old")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("Dispatch of a removed model = %v, want ErrNoProvider", err)
	}
	if p, _ := providerOf(e.svc.Snapshot(), "n1", "p1"); !slices.Equal(p.Models, []string{"new"}) {
		t.Fatalf("snapshot models %v", p.Models)
	}

	// Health only: the served models stay.
	n.send(t, providerUpdate(&nodev1.ProviderUpdate{ProviderId: "p1", Healthy: true, Capacity: 3}))
	e.waitUntil(t, "capacity 3", func(s contract.Snapshot) bool { p, _ := providerOf(s, "n1", "p1"); return p.Capacity == 3 })
	if got := e.svc.Models(); !slices.Contains(got, "new") {
		t.Fatalf("models %v after an update without models_set", got)
	}
}

// TestRemovedModelFailsItsWaiters: requests queued for a model that its
// only provider stops serving fail at once with ErrProviderUnavailable;
// while another live provider still serves it they stay queued and get its
// slot.
func TestRemovedModelFailsItsWaiters(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m", "other"), prov("p2", normalized, 1, "m")))
	e.startRun(t, n, chatReq("m"))
	e.startRun(t, n, chatReq("m"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queued := e.dispatchAsync(ctx, chatReq("m"))
	e.clk.waitArmed(t, testQueueTimeout, 1)

	n.send(t, setModels("p1", []string{"other"}))
	e.waitModels(t, []string{"m", "other"}, nil)
	if snap := e.svc.Snapshot(); snap.Waiters != 1 {
		t.Fatalf("%d waiters after p1 dropped m while p2 serves it, want 1", snap.Waiters)
	}
	n.send(t, setModels("p2", []string{"other"}))
	e.waitModels(t, []string{"other"}, []string{"m"})
	if r := wait(t, queued); !errors.Is(r.err, scheduler.ErrProviderUnavailable) {
		t.Fatalf("queued request: %v, want ErrProviderUnavailable", r.err)
	}
}

// TestUnhealthyUpdateTakesProviderOutOfRotation: an unhealthy provider is
// no candidate (its waiters fail when it was their last one, new requests
// go elsewhere or get ErrNoProvider) until an update says it is healthy.
func TestUnhealthyUpdateTakesProviderOutOfRotation(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("a", normalized, 1, "m"), prov("b", normalized, 1, "m")))
	e.startRun(t, n, chatReq("m"))
	e.startRun(t, n, chatReq("m"))
	queued := e.dispatchAsync(context.Background(), chatReq("m"))
	e.clk.waitArmed(t, testQueueTimeout, 1)

	n.send(t, providerUpdate(&nodev1.ProviderUpdate{ProviderId: "a", Healthy: false}))
	e.waitUntil(t, "a unhealthy", func(s contract.Snapshot) bool { p, _ := providerOf(s, "n1", "a"); return !p.Healthy })
	if snap := e.svc.Snapshot(); snap.Waiters != 1 {
		t.Fatalf("waiter gone while b still serves m: %d waiters", snap.Waiters)
	}
	n.send(t, providerUpdate(&nodev1.ProviderUpdate{ProviderId: "b", Healthy: false}))
	if r := wait(t, queued); !errors.Is(r.err, scheduler.ErrProviderUnavailable) {
		t.Fatalf("queued request: %v, want ErrProviderUnavailable", r.err)
	}
	if _, err := e.svc.Dispatch(context.Background(), chatReq("m")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("Dispatch with every provider unhealthy = %v, want ErrNoProvider", err)
	}
	if !slices.Contains(e.svc.Models(), "m") {
		t.Fatalf("an unhealthy provider's model is no longer listed: %v", e.svc.Models())
	}

	// Back in rotation, with a second slot (its first still holds a run
	// that went on while it was unhealthy).
	n.send(t, providerUpdate(&nodev1.ProviderUpdate{ProviderId: "b", Healthy: true, Capacity: 2}))
	e.waitUntil(t, "b healthy", func(s contract.Snapshot) bool { p, _ := providerOf(s, "n1", "b"); return p.Healthy })
	_, _, d := e.startRun(t, n, chatReq("m"))
	if d.GetProviderId() != "b" {
		t.Fatalf("dispatched to %s, want b (a is unhealthy)", d.GetProviderId())
	}
}

// TestCapabilitiesArePerServedModel: a model described in
// model_capabilities has exactly its own capabilities, others the
// provider's; tools requests go only to a tools model, embeddings only to an
// embedding model, chat not to an embedding-only model; an alias picks, per
// provider, its first target that has what the request needs.
func TestCapabilitiesArePerServedModel(t *testing.T) {
	cfg := testConfig()
	cfg.Models["any"] = ModelConfig{Targets: []string{"embed", "plain", "tooly"}}
	e := startEdge(t, cfg)
	p := prov("p1", normalized, 16, "embed", "plain", "tooly", "legacy")
	p.Capabilities = []string{"stream"}
	p.ModelCapabilities = []*nodev1.ModelCapabilities{
		modelCaps("embed", "stream", "embeddings"),
		modelCaps("plain", "stream", "completion"),
		modelCaps("tooly", "stream", "completion", "tools", "thinking"),
	}
	n := e.connect(t, hello("n1", p))
	// The admin snapshot shows each model's own capabilities, not a
	// discovered provider's ["stream"] alone.
	ps, _ := providerOf(e.svc.Snapshot(), "n1", "p1")
	if got := ps.ModelCapabilities["tooly"]; !slices.Equal(got, []string{"completion", "stream", "thinking", "tools"}) ||
		len(ps.ModelCapabilities) != 3 || ps.ModelCapabilities["legacy"] != nil {
		t.Fatalf("snapshot model capabilities %v", ps.ModelCapabilities)
	}

	for _, c := range []struct {
		req     contract.Request
		target  string // "" = refused
		missing string
	}{
		{toolsReq("tooly"), "tooly", ""},
		{toolsReq("plain"), "", "tools"},
		{toolsReq("embed"), "", "tools"},
		{chatReq("plain"), "plain", ""},
		{chatReq("embed"), "", "completion"},
		{chatReq("legacy"), "legacy", ""}, // the provider's capabilities: text generation assumed
		{toolsReq("legacy"), "", "tools"},
		{embedReq("embed"), "embed", ""},
		{embedReq("plain"), "", "embeddings"},
		{chatReq("any"), "plain", ""},
		{toolsReq("any"), "tooly", ""},
		{embedReq("any"), "embed", ""},
	} {
		name := c.req.Model + "/" + strings.Join(c.req.Needs, ",") + "/" + c.req.Operation.String()
		if c.target == "" {
			_, err := e.svc.Dispatch(context.Background(), c.req)
			if !errors.Is(err, scheduler.ErrCandidatesRejected) || !strings.Contains(err.Error(), `"`+c.missing+`"`) {
				t.Errorf("%s: %v, want ErrCandidatesRejected naming %q", name, err, c.missing)
			}
			continue
		}
		_, _, d := e.startRun(t, n, c.req)
		if d.GetServedModel() != c.target {
			t.Errorf("%s: dispatched as %q, want %q", name, d.GetServedModel(), c.target)
		}
	}

	// An update changes them: plain learns tools, tooly is gone.
	n.send(t, setModels("p1", []string{"embed", "plain"}, modelCaps("embed", "stream", "embeddings"), modelCaps("plain", "stream", "completion", "tools")))
	e.waitModels(t, []string{"plain"}, []string{"tooly"})
	_, _, d := e.startRun(t, n, toolsReq("any"))
	if d.GetServedModel() != "plain" {
		t.Fatalf("tools request for any after the update went to %q, want plain", d.GetServedModel())
	}
}

// TestModelInfoDescribesTheTarget: ModelInfo gives, per provider, the
// target it serves the model as, that model's capabilities (its own, or the
// provider's with completion) and its details as the node said them.
func TestModelInfoDescribesTheTarget(t *testing.T) {
	cfg := testConfig()
	cfg.Models["alias"] = ModelConfig{Targets: []string{"gone", "qwen3:latest", "legacy"}}
	e := startEdge(t, cfg)
	details := &nodev1.ModelDetails{Size: 1234, Digest: "abc", ModifiedAt: "2026-01-02T03:04:05Z", Format: "gguf", Family: "qwen3",
		Families: []string{"qwen3"}, ParameterSize: "8.2B", QuantizationLevel: "Q4_K_M", ContextLength: 40960}
	p := prov("p1", normalized, 1, "qwen3:latest")
	p.ModelCapabilities = []*nodev1.ModelCapabilities{{Model: "qwen3:latest", Capabilities: []string{"stream", "completion", "tools", "thinking"}, Details: details}}
	e.connect(t, hello("n1", p, prov("p2", tunnel, 1, "legacy", "qwen3:latest")))

	info, ok := e.svc.ModelInfo("alias")
	if !ok || len(info.Providers) != 2 {
		t.Fatalf("ModelInfo(alias) = %+v, %v", info, ok)
	}
	p1, p2 := info.Providers[0], info.Providers[1]
	if p1.ProviderID != "p1" || p1.Target != "qwen3:latest" || !slices.Equal(p1.Capabilities, []string{"completion", "stream", "thinking", "tools"}) ||
		!reflect.DeepEqual(p1.Details, &contract.ModelDetails{Size: 1234, Digest: "abc", ModifiedAt: "2026-01-02T03:04:05Z", Format: "gguf",
			Family: "qwen3", Families: []string{"qwen3"}, ParameterSize: "8.2B", QuantizationLevel: "Q4_K_M", ContextLength: 40960}) {
		t.Errorf("p1: %+v", p1)
	}
	if p2.ProviderID != "p2" || p2.Target != "qwen3:latest" || !slices.Equal(p2.Capabilities, []string{"cancel", "completion", "stream"}) || p2.Details != nil {
		t.Errorf("p2: %+v", p2)
	}
	if info, _ := e.svc.ModelInfo("legacy"); len(info.Providers) != 1 || info.Providers[0].Target != "legacy" {
		t.Errorf("ModelInfo(legacy) = %+v", info)
	}
}

// TestDiscoveringProviderJoinsUnhealthyWithoutModels: a provider whose node
// could not read its server's models yet joins unhealthy with none, is no
// candidate, and serves once an update brings models; a healthy provider
// without models is refused, in Hello and in an update.
func TestDiscoveringProviderJoinsUnhealthyWithoutModels(t *testing.T) {
	e := startEdge(t, testConfig())
	waiting := &nodev1.Provider{Id: "ollama", Type: "ollama", ExecutionPath: normalized, Capabilities: []string{"stream"}}
	n := e.connect(t, hello("n1", waiting))
	if _, err := e.svc.Dispatch(context.Background(), chatReq("llama3:latest")); !errors.Is(err, scheduler.ErrUnknownModel) {
		t.Fatalf("Dispatch before discovery = %v, want ErrUnknownModel", err)
	}
	for _, bad := range []*nodev1.ProviderUpdate{
		{ProviderId: "ollama", Healthy: true},                                        // healthy, still no models
		{ProviderId: "ollama", Healthy: true, ModelsSet: true},                       // healthy with none
		{ProviderId: "ollama", Healthy: true, ModelsSet: true, Models: []string{""}}, // empty name
		{ProviderId: "ollama", Healthy: true, ModelsSet: true, Models: []string{"a"},
			ModelCapabilities: []*nodev1.ModelCapabilities{modelCaps("a"), modelCaps("a")}}, // described twice
	} {
		if _, ok := e.svc.reg.update(n.conn(t), bad); ok {
			t.Errorf("update %v applied", bad)
		}
	}
	n.send(t, setModels("ollama", []string{"llama3:latest"}))
	e.waitModels(t, []string{"llama3:latest"}, nil)
	_, _, d := e.startRun(t, n, chatReq("llama3"))
	if d.GetServedModel() != "llama3:latest" {
		t.Fatalf("dispatch %v", d)
	}

	healthyEmpty := &nodev1.Provider{Id: "x", Type: "ollama", ExecutionPath: normalized, Healthy: true}
	if _, err := parseHello(hello("n2", healthyEmpty), time.Time{}); !errors.Is(err, errHelloInvalid) || !strings.Contains(err.Error(), "no models") {
		t.Fatalf("parseHello(healthy, no models) = %v", err)
	}
	twice := prov("x", normalized, 1, "a")
	twice.ModelCapabilities = []*nodev1.ModelCapabilities{modelCaps("a"), modelCaps("a")}
	if _, err := parseHello(hello("n2", twice), time.Time{}); !errors.Is(err, errHelloInvalid) {
		t.Fatalf("parseHello(model described twice) = %v", err)
	}
}

// conn returns the registry's current connection of n.
func (n *fakeNode) conn(t *testing.T) *conn {
	t.Helper()
	c := n.e.svc.reg.current(n.id)
	if c == nil || c.gen != n.gen {
		t.Fatalf("node %s generation %d is not current", n.id, n.gen)
	}
	return c
}

// TestRegression_ThinkingRequestGoesToAModelThatThinks: one model served
// by two nodes, only one of whose servers says the model can think (its
// /api/show lists "thinking"). A request that asks for thinking goes to
// that one, though the other wins the tie by node id; before, it went to
// the other and got Ollama's 400 "does not support thinking" every time.
// A model whose capabilities are its
// provider's (configured, not said by the server) is assumed to think. No
// live provider whose model thinks: 400 naming the capability.
func TestRegression_ThinkingRequestGoesToAModelThatThinks(t *testing.T) {
	e := startEdge(t, testConfig())
	plain := prov("p", normalized, 4, "llama3.1:8b")
	plain.ModelCapabilities = []*nodev1.ModelCapabilities{modelCaps("llama3.1:8b", "completion")}
	thinker := prov("p", normalized, 4, "llama3.1:8b")
	thinker.ModelCapabilities = []*nodev1.ModelCapabilities{modelCaps("llama3.1:8b", "completion", "thinking")}
	e.connect(t, hello("gpu-1", plain))
	n2 := e.connect(t, hello("gpu-2", thinker))

	think := chatReq("llama3.1:8b")
	think.Needs = []string{NeedThinking}
	for i := 0; i < 3; i++ {
		run, _, _ := e.startRun(t, n2, think)
		if run.Info().NodeID != "gpu-2" {
			t.Fatalf("thinking request %d went to %s, want gpu-2", i, run.Info().NodeID)
		}
		run.Close("test")
		n2.nextCancel(t)
	}

	e2 := startEdge(t, testConfig())
	nc := e2.connect(t, hello("n-configured", prov("c", normalized, 1, "qwen3")))
	e2.connect(t, hello("n-plain", plain))
	q := chatReq("qwen3")
	q.Needs = []string{NeedThinking}
	run, _, _ := e2.startRun(t, nc, q)
	run.Close("test")
	l := chatReq("llama3.1:8b")
	l.Needs = []string{NeedThinking}
	if _, err := e2.svc.Dispatch(context.Background(), l); !errors.Is(err, scheduler.ErrCandidatesRejected) || !strings.Contains(err.Error(), `"thinking"`) {
		t.Fatalf("thinking request for a model that cannot think: %v, want a rejection naming thinking", err)
	}
}
