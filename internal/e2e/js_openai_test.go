package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// jsDir holds the JavaScript client tests and their package.json; `make
// test` installs their node_modules (npm ci) before running the Go tests.
var jsDir = filepath.Join("..", "..", "test", "js")

// requireJS returns the node binary and the JavaScript test files matching
// pattern. When Node.js or the installed packages are missing it fails the
// test under `make test` and skips it elsewhere (package testenv).
func requireJS(t *testing.T, pattern string) (nodeBin string, files []string) {
	t.Helper()
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		testenv.Missing(t, "Node.js (node) is not on PATH; it is needed for the JavaScript client tests")
	}
	if _, err := os.Stat(filepath.Join(jsDir, "node_modules")); err != nil {
		testenv.Missing(t, "%s is missing: run `make test`, which installs the JavaScript test packages (npm ci in test/js)",
			filepath.Join("test", "js", "node_modules"))
	}
	files, err = filepath.Glob(filepath.Join(jsDir, pattern))
	if err != nil || len(files) == 0 {
		t.Fatalf("no JavaScript tests match %s in %s", pattern, jsDir)
	}
	return nodeBin, files
}

// TestOpenAIJavaScriptClient runs test/js/openai_*.mjs, the official
// `openai` npm client, against a real edge and node (runJSClientSuite).
func TestOpenAIJavaScriptClient(t *testing.T) {
	harness.Parallel(t)
	runJSClientSuite(t, "openai_*.mjs", []string{"tools", "embeddings"}, "/v1", 2*time.Minute)
}

// runJSClientSuite runs the JavaScript test files matching pattern (node
// --test) against a real edge and a node with an Ollama and an
// OpenAI-compatible simulator (one per execution path: IOP_MODELS names
// their models by path), and a thinking one of each (IOP_THINKING), the
// first two with capabilities caps. IOP_BASE_URL is the edge's HTTP
// address followed by basePath ("/v1" for OpenAI's clients, "" for
// Anthropic's). The suite must pass within timeout, and leave the edge
// idle (every slot released).
func runJSClientSuite(t *testing.T, pattern string, caps []string, basePath string, timeout time.Duration) {
	nodeBin, files := requireJS(t, pattern)
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{normalizedModel}, Seed: 11})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{tunnelModel}, Seed: 11})
	_, thinkOllamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{thinkOllamaModel}, Seed: 11, Thinking: true})
	_, thinkOpenAIURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{thinkOpenAIModel}, Seed: 11, Thinking: true})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(nil))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
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

	runCtx, stop := context.WithTimeout(context.Background(), timeout)
	defer stop()
	cmd := exec.CommandContext(runCtx, nodeBin, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Env = append(os.Environ(), "IOP_BASE_URL=http://"+e.HTTPAddr+basePath, "IOP_MODELS="+string(models),
		"IOP_THINKING="+string(thinkers), "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test %v: %v\n%s", files, err, out)
	}
	t.Logf("%s", out)
	waitIdle(t, e)
}
