package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// jsTestDir holds the JavaScript client tests and their package.json.
const jsTestDir = "../../test/js"

// runJSTest runs `node script` in test/js with env. When Node.js or the npm
// packages are missing it fails the test under `make test` (which installs
// the packages with npm ci first) and skips it elsewhere (package testenv).
func runJSTest(t *testing.T, script string, env ...string) {
	t.Helper()
	dir, err := filepath.Abs(jsTestDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		testenv.Missing(t, "%s/node_modules is missing: run `make test` (it runs `npm ci` there) or `cd test/js && npm ci`", jsTestDir)
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "node (Node.js 20 or later) is not on PATH; the JavaScript client tests need it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodeBin, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, out)
	}
	if !strings.Contains(string(out), "checks passed") {
		t.Fatalf("node %s printed no summary:\n%s", script, out)
	}
	t.Logf("node %s:\n%s", script, out)
}

// TestOllamaJavaScriptClient runs the official `ollama` npm client against
// the edge, with an Ollama provider (normalized path) and an
// OpenAI-compatible one (tunnel path): chat and generate, streaming and
// not, chat with tools, embed in batch and the older embeddings call, and
// think with thinking models of both protocols (test/js/ollama_client.mjs).
func TestOllamaJavaScriptClient(t *testing.T) {
	harness.Parallel(t)
	_, thinkOllamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{thinkOllamaModel}, Seed: 11, Thinking: true})
	_, thinkOpenAIURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{thinkOpenAIModel}, Seed: 11, Thinking: true})
	rig := startOllamaRig(t,
		node.ProviderConfig{ID: "ollama-thinking", Type: node.TypeOllama, BaseURL: thinkOllamaURL, Models: []string{thinkOllamaModel}, Capacity: 2},
		node.ProviderConfig{ID: "vllm-thinking", Type: "vllm", BaseURL: thinkOpenAIURL + "/v1", Models: []string{thinkOpenAIModel}, Capacity: 2})
	models, _ := json.Marshal([]string{"llama3", rigOpenAIModel})
	thinkers, _ := json.Marshal([]string{"qwen3", thinkOpenAIModel})
	runJSTest(t, "ollama_client.mjs",
		"IOP_OLLAMA_HOST=http://"+rig.e.HTTPAddr,
		"IOP_MODELS="+string(models),
		`IOP_VISION=["llama3"]`,
		"IOP_THINKING="+string(thinkers))
	waitIdle(t, rig.e)
}
