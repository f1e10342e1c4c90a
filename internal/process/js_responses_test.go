package process

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"iop/internal/node"
	"iop/internal/sim"
)

// TestResponsesJavaScriptClients runs test/js/responses_*.mjs, the official
// clients of OpenAI's Responses API (`openai` responses.*, the OpenAI
// Agents SDK in its default mode, the AI SDK's default openai(id)),
// unchanged against a real edge and node with an Ollama and an
// OpenAI-compatible simulator (one per execution path), and a thinking one
// of each for the reasoning summaries.
func TestResponsesJavaScriptClients(t *testing.T) {
	nodeBin, files := requireJS(t, "responses_*.mjs")
	_, ollamaURL := startSim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{normalizedModel}, Seed: 11})
	_, openaiURL := startSim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{tunnelModel}, Seed: 11})
	_, thinkOllamaURL := startSim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{thinkOllamaModel}, Seed: 11, Thinking: true})
	_, thinkOpenAIURL := startSim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{thinkOpenAIModel}, Seed: 11, Thinking: true})
	ctx, cancel := context.WithCancel(context.Background())
	e := startTestEdge(t, ctx, nil)
	stopOnCleanup(t, cancel, e)
	caps := []string{"tools", "vision"}
	startNode(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "ollama", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{normalizedModel}, Capacity: 4, Capabilities: caps},
			{ID: "vllm", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{tunnelModel}, Capacity: 4, Capabilities: caps},
			{ID: "ollama-thinking", Type: node.TypeOllama, BaseURL: thinkOllamaURL, Models: []string{thinkOllamaModel}, Capacity: 4},
			{ID: "vllm-thinking", Type: "vllm", BaseURL: thinkOpenAIURL + "/v1", Models: []string{thinkOpenAIModel}, Capacity: 4},
		},
	})
	models, _ := json.Marshal([]map[string]string{{"path": "normalized", "model": normalizedModel}, {"path": "tunnel", "model": tunnelModel}})
	thinkers, _ := json.Marshal([]map[string]string{{"path": "normalized", "model": thinkOllamaModel}, {"path": "tunnel", "model": thinkOpenAIModel}})

	runCtx, stop := context.WithTimeout(context.Background(), 3*time.Minute)
	defer stop()
	cmd := exec.CommandContext(runCtx, nodeBin, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Env = append(os.Environ(), "IOP_BASE_URL=http://"+e.HTTPAddr+"/v1", "IOP_MODELS="+string(models),
		"IOP_THINKING="+string(thinkers), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %v: %v\n%s", files, err, out)
	}
	t.Logf("%s", out)
	waitIdle(t, e)
}
