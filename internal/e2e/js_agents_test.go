package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
)

// jsModel is one entry of the JavaScript suites' model lists.
type jsModel struct {
	Path  string `json:"path"`
	Model string `json:"model"`
}

// runAgentSuite runs test/js/agent_frameworks.test.mjs (node --test)
// against the edge at addr with env's model lists.
func runAgentSuite(t *testing.T, addr string, env ...string) {
	t.Helper()
	nodeBin, files := requireJS(t, "agent_frameworks.test.mjs")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, append([]string{"--test", "--test-reporter=spec", "--test-concurrency=1"}, files...)...)
	cmd.Env = append(os.Environ(), append([]string{"IOP_BASE_URL=http://" + addr + "/v1", "IOP_OLLAMA_HOST=http://" + addr, "NO_COLOR=1"}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %v: %v\n%s", files, err, out)
	}
	t.Logf("%s", out)
}

func jsModels(t *testing.T, models ...jsModel) string {
	t.Helper()
	b, err := json.Marshal(models)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAgentFrameworkClients runs the clients agent frameworks are built on
// (the Vercel AI SDK with @ai-sdk/openai-compatible and
// ollama-ai-provider-v2; LangChain.js's ChatOpenAI and ChatOllama) against
// a real edge and node with an Ollama simulator (normalized path) and an
// OpenAI-compatible one (tunnel path), and a thinking simulator of each
// protocol: generate, stream, a tool round trip, structured output,
// embeddings and reasoning, each per client and path, and ChatOllama's
// checkOrPullModel (test/js/agent_frameworks.test.mjs).
func TestAgentFrameworkClients(t *testing.T) {
	harness.ParallelLong(t)
	_, thinkOllamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{thinkOllamaModel}, Seed: 11, Thinking: true})
	_, thinkOpenAIURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{thinkOpenAIModel}, Seed: 11, Thinking: true})
	rig := startOllamaRig(t,
		node.ProviderConfig{ID: "ollama-thinking", Type: node.TypeOllama, BaseURL: thinkOllamaURL, Models: []string{thinkOllamaModel}, Capacity: 2},
		node.ProviderConfig{ID: "vllm-thinking", Type: "vllm", BaseURL: thinkOpenAIURL + "/v1", Models: []string{thinkOpenAIModel}, Capacity: 2})
	runAgentSuite(t, rig.e.HTTPAddr,
		"IOP_MODELS="+jsModels(t, jsModel{"normalized", rigOllamaModel}, jsModel{"tunnel", rigOpenAIModel}),
		"IOP_THINKING="+jsModels(t, jsModel{"normalized", thinkOllamaModel}, jsModel{"tunnel", thinkOpenAIModel}),
		"IOP_ALIAS=both")
	waitIdle(t, rig.e)
}
