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

// TestAnthropicJavaScriptClient runs test/js/anthropic_*.mjs, the official
// `@anthropic-ai/sdk` client unchanged, against a real edge's /v1/messages
// and a node with an Ollama and an OpenAI-compatible simulator (one per
// execution path), and a thinking one of each for the thinking checks.
func TestAnthropicJavaScriptClient(t *testing.T) {
	nodeBin, files := requireJS(t, "anthropic_*.mjs")
	_, ollamaURL := startSim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{normalizedModel}, Seed: 11})
	_, openaiURL := startSim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{tunnelModel}, Seed: 11})
	_, thinkOllamaURL := startSim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{thinkOllamaModel}, Seed: 11, Thinking: true})
	_, thinkOpenAIURL := startSim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{thinkOpenAIModel}, Seed: 11, Thinking: true})
	ctx, cancel := context.WithCancel(context.Background())
	e := startTestEdge(t, ctx, nil)
	stopOnCleanup(t, cancel, e)
	caps := []string{"tools"}
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

	runCtx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stop()
	cmd := exec.CommandContext(runCtx, nodeBin, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Env = append(os.Environ(), "IOP_BASE_URL=http://"+e.HTTPAddr, "IOP_MODELS="+string(models),
		"IOP_THINKING="+string(thinkers), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %v: %v\n%s", files, err, out)
	}
	t.Logf("%s", out)
	waitIdle(t, e)
}
