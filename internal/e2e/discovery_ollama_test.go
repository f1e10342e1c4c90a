package e2e

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/ollamatest"
	"iop/internal/process"
	"iop/internal/testenv"
)

// promptLength matches Ollama's debug log line of a completion request to
// its runner (llm/server.go, OLLAMA_DEBUG): "prompt" is the length, in
// bytes, of the prompt its template rendered.
var promptLength = regexp.MustCompile(`msg="completion request".* prompt=(\d+)`)

// embedRequest matches Ollama's access log line of a POST /api/embed.
var embedRequest = regexp.MustCompile(`\| 200 \|.*POST\s+"/api/embed"`)

// ollamaDiscoveredServer is a real Ollama (ollamatest) serving a tools
// model, a plain one and an embedding model, tiny random-weight models
// created in the test.
func ollamaDiscoveredServer(t *testing.T) *discoveredServer {
	t.Helper()
	s := ollamatest.Start(t)
	s.CreateModel(t, "coder", ollamatest.Tools)
	s.CreateModel(t, "plain", ollamatest.Plain)
	s.CreateModel(t, "embed", ollamatest.Embedding)
	d := &discoveredServer{url: s.URL, toolsModel: "coder:latest", plainModel: "plain:latest", embedModel: "embed:latest"}
	d.create = func(t *testing.T, name string) { s.CreateModel(t, name, ollamatest.Plain) }
	d.remove = func(t *testing.T, name string) { s.DeleteModel(t, name) }
	d.stop = func(*testing.T) { s.Stop() }
	d.start = func(t *testing.T) { s.Restart(t) }
	d.mark = func() int { return len(s.Log()) }
	// lastPrompt is the prompt length of the last completion request
	// logged between from and to.
	lastPrompt := func(t *testing.T, from, to int) int {
		t.Helper()
		log := s.Log()
		m := promptLength.FindAllStringSubmatch(log[from:to], -1)
		if len(m) == 0 {
			t.Fatalf("Ollama logged no completion request:\n%s", log[from:to])
		}
		n, _ := strconv.Atoi(m[len(m)-1][1])
		return n
	}
	d.checkToolsReached = func(t *testing.T, without, withTools int, _ []byte) {
		// The tools model's template renders the request's tools into the
		// prompt ("<|tools|>" and each tool as JSON): the same request with
		// a tool makes a longer prompt, by at least the tool's name.
		a, b := lastPrompt(t, without, withTools), lastPrompt(t, withTools, len(s.Log()))
		if b < a+len("<|tools|>get_weather") {
			t.Fatalf("prompt of %d bytes with the tool, %d without: the tool did not reach Ollama's template", b, a)
		}
	}
	d.checkEmbedReached = func(t *testing.T, mark int) {
		// Ollama logs the request (GIN) and its scheduler the runner that
		// served it going idle: that of the embedding model. The log may
		// trail the answer a little.
		runner := `msg="runner with non-zero duration has gone idle, adding timer" runner.name=registry.ollama.ai/library/embed:latest `
		testenv.Eventually(t, "Ollama's log of a request of the embedding model", func() bool {
			log := s.LogSince(mark)
			return embedRequest.MatchString(log) && strings.Contains(log, runner)
		})
	}
	return d
}

// TestDiscoveryEndToEndOllama is TestDiscoveryEndToEnd against a real
// Ollama: a tools request to a tools-capable model is admitted and reaches
// Ollama with its tools; an embeddings request reaches the embedding model;
// a model created after the node started is listed within about one
// discovery interval; stopping Ollama marks the provider unhealthy and
// starting it again brings it back, with no restart of edge or node.
func TestDiscoveryEndToEndOllama(t *testing.T) {
	harness.ParallelOllama(t)
	runDiscoveryEndToEnd(t, ollamaDiscoveredServer(t))
}

// TestRegression_DevRealOllamaAdmitsTools: iop dev in front of a real
// Ollama refused a chat request with tools 400 ("no provider for model
// demo has capability tools"), because its node advertised only "stream".
// Demo's tools request is admitted and answered by the tools model, and its embeddings request by
// the embedding model.
func TestRegression_DevRealOllamaAdmitsTools(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	s.CreateModel(t, "coder", ollamatest.Tools)
	s.CreateModel(t, "embed", ollamatest.Embedding)
	d := startDevOllama(t, s.URL)
	if len(d.Dev.Sims) != 0 || !slices.Equal(d.Dev.Models, []string{"coder:latest", "embed:latest"}) {
		t.Fatalf("iop dev serves %v (sims %d), want the Ollama's models, the chat one first", d.Dev.Models, len(d.Dev.Sims))
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	base := "http://" + d.HTTPAddr
	status, body := postTo(t, c, base+"/v1/chat/completions", `{"model":"demo","max_tokens":3,"messages":[{"role":"user","content":"use get_weather"}],`+
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{}}}}]}`)
	if status != http.StatusOK || !strings.Contains(string(body), `"model":"demo"`) {
		t.Fatalf("tools request to demo: %d %s", status, body)
	}
	status, body = postTo(t, c, base+"/v1/embeddings", `{"model":"demo","input":"a"}`)
	if status != http.StatusOK || !strings.Contains(string(body), `"embedding"`) {
		t.Fatalf("embeddings request to demo: %d %s", status, body)
	}
}

// TestRegression_ModelListsShowNoPathOfTheOllamaHost: /api/tags through
// iop dev in front of a real Ollama showed a model's parent_model as the
// path of its blob on the Ollama host ("/.../models/blobs/sha256-..."),
// taken from /api/show, where Ollama's own /api/tags says "". No model list or description iop serves carries a path of the
// host.
func TestRegression_ModelListsShowNoPathOfTheOllamaHost(t *testing.T) {
	harness.ParallelOllama(t)
	s := ollamatest.Start(t)
	s.CreateModel(t, "plain", ollamatest.Plain)
	d := startDevOllama(t, s.URL)
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	base := "http://" + d.HTTPAddr
	// The real Ollama's /api/show does name the path, so the test checks
	// something that could leak.
	if status, body := postTo(t, c, s.URL+"/api/show", `{"model":"plain"}`); status != http.StatusOK || !strings.Contains(string(body), "blobs/sha256") {
		t.Fatalf("Ollama's /api/show: %d %s, want a parent_model path to guard against", status, body)
	}
	get := func(path string) string {
		resp, err := c.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return string(b)
	}
	_, show := postTo(t, c, base+"/api/show", `{"model":"plain"}`)
	for what, body := range map[string]string{"/api/tags": get("/api/tags"), "/v1/models": get("/v1/models"), "/api/show": string(show), "/api/ps": get("/api/ps")} {
		if strings.Contains(body, "blobs/sha256") || strings.Contains(body, `"parent_model":"/`) {
			t.Errorf("%s shows a path of the Ollama host: %s", what, body)
		}
	}
}

// startDevOllama starts iop dev in front of the Ollama at url, stopped (and
// its exit checked) when the test ends.
func startDevOllama(t *testing.T, url string) *process.Process {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d, err := process.Start(ctx, process.Config{Mode: process.ModeDev, Dev: process.DevConfig{Listen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", OllamaURL: url, SimCapacity: 1}}, process.Deps{Logger: harness.Logger(t, "iop dev")})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := d.Wait(); err != nil {
			t.Errorf("iop dev: %v", err)
		}
	})
	return d
}
