package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// TestDevDemoAnswersEmbeddings: the simulated providers of `iop dev`
// declare capability embeddings, so the alias demo answers embedding
// requests (on whichever of its providers is least loaded).
func TestDevDemoAnswersEmbeddings(t *testing.T) {
	harness.Parallel(t)
	d := harness.Dev(t, process.DevConfig{}, nil)
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	for _, model := range append([]string{"demo"}, d.Dev.Models...) {
		status, body := postTo(t, c, "http://"+d.HTTPAddr+"/v1/embeddings", `{"model":"`+model+`","input":["a","b c"]}`)
		var got struct {
			Data []struct {
				Embedding []float32 `json:"embedding"`
			} `json:"data"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &got) != nil || len(got.Data) != 2 || len(got.Data[1].Embedding) == 0 {
			t.Fatalf("%s: %d %s", model, status, body)
		}
	}
}

// TestRegression_DevOllamaAdmitsToolsAndEmbeddings: with a local Ollama,
// iop dev advertised only "stream" for its provider, so a chat request with
// tools was refused 400 ("no provider for model demo has capability
// tools") and embeddings too. Now the node discovers each model's
// capabilities from /api/show: the alias demo sends a tools request to the
// tools model and an embeddings request to the embedding model; a model
// pulled while iop dev runs is listed without a restart.
func TestRegression_DevOllamaAdmitsToolsAndEmbeddings(t *testing.T) {
	harness.Parallel(t)
	s, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"nomic-embed-text:latest", "qwen3:latest"},
		Capabilities: map[string][]string{"qwen3:latest": {"completion", "tools", "thinking"}, "nomic-embed-text:latest": {"embedding"}}})
	ctx, cancel := context.WithCancel(context.Background())
	d, err := process.Start(ctx, process.Config{Mode: process.ModeDev, Dev: process.DevConfig{Listen: "127.0.0.1:0", NodeListen: "127.0.0.1:0", OllamaURL: ollamaURL,
		DiscoveryInterval: discoveryInterval, SimCapacity: 1}}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := d.Wait(); err != nil {
			t.Errorf("iop dev: %v", err)
		}
	}()
	if len(d.Dev.Sims) != 0 || !slices.Equal(d.Dev.Models, []string{"qwen3:latest", "nomic-embed-text:latest"}) {
		t.Fatalf("iop dev serves %v (sims %d), want the local Ollama's models, the chat one first", d.Dev.Models, len(d.Dev.Sims))
	}
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	base := "http://" + d.HTTPAddr
	status, body := postTo(t, c, base+"/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"use get_weather"}],`+
		`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{}}}}]}`)
	if status != http.StatusOK || !strings.Contains(string(body), `"tool_calls"`) {
		t.Fatalf("tools request to demo: %d %s", status, body)
	}
	status, body = postTo(t, c, base+"/v1/embeddings", `{"model":"demo","input":"a"}`)
	if status != http.StatusOK {
		t.Fatalf("embeddings request to demo: %d %s", status, body)
	}
	// The last request that ran a model: the node's discovery (GET
	// /api/tags, POST /api/show) polls the server meanwhile.
	var last sim.SeenRequest
	for _, r := range s.Seen() {
		if r.Method == http.MethodPost && r.Path != "/api/show" {
			last = r
		}
	}
	if last.Path != "/api/embed" || last.Model != "nomic-embed-text:latest" {
		t.Fatalf("the embeddings request reached %+v", last)
	}

	s.AddModel("llama3.2:latest", "completion", "tools")
	testenv.Eventually(t, "the pulled model is listed", func() bool {
		var models struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		getJSON(t, d, "/v1/models", &models)
		return slices.ContainsFunc(models.Data, func(m struct {
			ID string `json:"id"`
		}) bool {
			return m.ID == "llama3.2:latest"
		})
	})
}

// TestDevSimThinking: iop dev --sim-thinking serves thinking models on both
// execution paths: an Ollama client asking for thinking gets
// message.thinking, an OpenAI client reasoning_content, before the answer
// (a new user could not try thinking against iop dev).
func TestDevSimThinking(t *testing.T) {
	harness.Parallel(t)
	d := harness.Dev(t, process.DevConfig{SimThinking: true}, nil)
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	base := "http://" + d.HTTPAddr
	for _, model := range []string{"sim-ollama", "sim-openai"} {
		status, body := postTo(t, c, base+"/api/chat", `{"model":"`+model+`","stream":false,"think":true,"messages":[{"role":"user","content":"hi"}]}`)
		var got struct {
			Message struct{ Content, Thinking string } `json:"message"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Message.Thinking == "" || got.Message.Content == "" {
			t.Errorf("/api/chat %s: %d %s, want thinking and content", model, status, body)
		}
		status, body = postTo(t, c, base+"/v1/chat/completions", `{"model":"`+model+`","reasoning_effort":"low","messages":[{"role":"user","content":"hi"}]}`)
		var oa struct {
			Choices []struct {
				Message struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if status != http.StatusOK || json.Unmarshal(body, &oa) != nil || len(oa.Choices) != 1 || oa.Choices[0].Message.ReasoningContent == "" {
			t.Errorf("/v1/chat/completions %s: %d %s, want reasoning_content", model, status, body)
		}
	}
}

// TestDevQueuesAreFair: iop dev's model queues share their slots fairly
// between flows by default: /admin/v1/queues says fairness on
// for each, with its flows listed (none queued here).
func TestDevQueuesAreFair(t *testing.T) {
	harness.Parallel(t)
	d := harness.Dev(t, process.DevConfig{}, nil)
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + d.HTTPAddr + "/admin/v1/queues")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var queues []struct {
		Model  string
		Policy struct{ Fairness string }
		Flows  []json.RawMessage
	}
	if err := json.NewDecoder(resp.Body).Decode(&queues); err != nil || resp.StatusCode != http.StatusOK || len(queues) == 0 {
		t.Fatalf("GET /admin/v1/queues: %d %v %v", resp.StatusCode, queues, err)
	}
	for _, q := range queues {
		if q.Policy.Fairness != "on" || q.Flows == nil {
			t.Errorf("queue %s: fairness %q flows %v, want on and []", q.Model, q.Policy.Fairness, q.Flows)
		}
	}
}
