package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// TestRegression_TranslatedRoutesOpenTheCircuit: an OpenAI-compatible
// provider whose streams break off with an error object (a simulator with
// StreamErrorAfter, as vLLM reports a failed generation) is taken out of
// rotation after the breaker's failures by requests of every route, not
// only /v1/chat/completions: the Responses, Messages and Ollama routes'
// failures must open its circuit and never reset its failure count. Each route on its own provider,
// streamed and not (the translated routes ask the provider for a stream
// either way; a non-streamed chat request gets the simulator's whole,
// unbroken answer, so chat is streamed only): three failures open the
// circuit, and the next request is refused 503 without reaching the
// provider.
func TestRegression_TranslatedRoutesOpenTheCircuit(t *testing.T) {
	harness.Parallel(t)
	both := []bool{true, false}
	routes := []struct {
		name, path, body string
		streams          []bool
	}{
		{"chat", "/v1/chat/completions", `{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, []bool{true}},
		{"responses", "/v1/responses", `{"model":%q,"input":"hi","stream":%v}`, both},
		{"messages", "/v1/messages", `{"model":%q,"max_tokens":64,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, both},
		{"ollama", "/api/chat", `{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, both},
	}
	cfg := process.DefaultEdgeFile()
	retries := 0
	cfg.MaxRetries = &retries
	cfg.CircuitBreaker.Failures = 3
	e, ctx := startFaultEdge(t, cfg)
	var providers []node.ProviderConfig
	sims := map[string]*sim.Server{}
	for _, rt := range routes {
		for _, stream := range rt.streams {
			model := fmt.Sprintf("%s-%v", rt.name, stream)
			s, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{model}, Faults: sim.Faults{StreamErrorAfter: 2}})
			sims[model] = s
			providers = append(providers, node.ProviderConfig{ID: model, Type: "vllm", BaseURL: url + "/v1", Models: []string{model}, Capacity: 2})
		}
	}
	harness.Node(t, context.WithoutCancel(ctx), node.Config{NodeID: "gpu-1", Edge: e.NodeAddr, Providers: providers})
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return len(s.Providers) == len(providers) })
	for _, rt := range routes {
		for _, stream := range rt.streams {
			model := fmt.Sprintf("%s-%v", rt.name, stream)
			t.Run(model, func(t *testing.T) {
				for i := range 3 {
					post(t, e, rt.path, fmt.Sprintf(rt.body, model, stream))
					if got := circuitState(e, model); (i < 2) != (got == "closed") {
						t.Fatalf("after %d broken answers the circuit is %s", i+1, got)
					}
				}
				before := sims[model].Stats().Requests
				if status, _, body := post(t, e, rt.path, fmt.Sprintf(rt.body, model, stream)); status != http.StatusServiceUnavailable {
					t.Errorf("with the circuit open: %d %s, want 503", status, body)
				}
				if after := sims[model].Stats().Requests; after != before {
					t.Errorf("the provider got %d more requests with its circuit open", after-before)
				}
			})
		}
	}
	waitIdle(t, e)
}

// circuitState is the circuit of the provider with id (on gpu-1).
func circuitState(e *process.Process, id string) string {
	for _, p := range e.Service.Snapshot().Providers {
		if p.ProviderID == id {
			return p.Circuit
		}
	}
	return ""
}
