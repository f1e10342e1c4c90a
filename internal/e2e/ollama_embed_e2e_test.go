package e2e

// End-to-end tests of the edge's Ollama embeddings routes (POST /api/embed
// and the older POST /api/embeddings) on the ollamaRig: a real edge and
// node, `iop sim` providers of both wire protocols behind recording
// proxies.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/node"
	"iop/internal/sim"
)

// ollamaEmbedAnswer is an /api/embed answer, every field the edge writes.
type ollamaEmbedAnswer struct {
	Model           string      `json:"model"`
	Embeddings      [][]float32 `json:"embeddings"`
	TotalDuration   int64       `json:"total_duration"`
	LoadDuration    int64       `json:"load_duration"`
	PromptEvalCount int         `json:"prompt_eval_count"`
}

// decodeStrict decodes exactly one JSON object into v, rejecting unknown
// fields.
func decodeStrict(t *testing.T, data []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil || dec.More() {
		t.Fatalf("not one %T: %v: %s", v, err, data)
	}
}

func TestOllamaEmbedBothProviderProtocols(t *testing.T) {
	harness.Parallel(t)
	rig := startOllamaRig(t)
	var batch [][]float32 // the first provider's answer; the other must match it
	for _, p := range []struct {
		name, model, providerPath string
		proxy                     *recordingProxy
	}{
		{"ollama", "llama3", "/api/embed", rig.ollamaProxy},
		{"openai", rigOpenAIModel, "/v1/embeddings", rig.openaiProx},
	} {
		t.Run(p.name, func(t *testing.T) {
			resp, data := rig.do(t, http.MethodPost, "/api/embed", fmt.Sprintf(
				`{"model":%q,"input":["first text","second text"],"truncate":false,"keep_alive":"5m","options":{"num_ctx":512}}`, p.model))
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
				t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), data)
			}
			var a ollamaEmbedAnswer
			decodeStrict(t, data, &a)
			if a.Model != p.model || len(a.Embeddings) != 2 || len(a.Embeddings[0]) != 8 || reflect.DeepEqual(a.Embeddings[0], a.Embeddings[1]) {
				t.Fatalf("answer %s", data)
			}
			if a.PromptEvalCount != 4 || a.TotalDuration <= 0 || a.LoadDuration <= 0 || a.LoadDuration > a.TotalDuration {
				t.Fatalf("counts and durations: %+v", a)
			}
			if batch == nil {
				batch = a.Embeddings
			} else if !reflect.DeepEqual(a.Embeddings, batch) {
				t.Fatalf("the providers embedded one text differently: %v and %v", batch, a.Embeddings)
			}

			sent := p.proxy.last(t)
			var got map[string]json.RawMessage
			if err := json.Unmarshal(sent.Body, &got); err != nil || sent.Path != p.providerPath {
				t.Fatalf("the provider got %s %s", sent.Path, sent.Body)
			}
			if string(got["input"]) != `["first text","second text"]` {
				t.Fatalf("the provider got input %s", got["input"])
			}
			if p.name == "ollama" {
				// Ollama-only fields reach an Ollama provider with their JSON types.
				if string(got["truncate"]) != "false" || string(got["keep_alive"]) != `"5m"` || string(got["options"]) != `{"num_ctx":512}` {
					t.Fatalf("the Ollama provider got %s", sent.Body)
				}
			} else {
				for _, k := range []string{"iop_ollama", "truncate", "keep_alive", "options"} {
					if _, ok := got[k]; ok {
						t.Fatalf("the OpenAI-compatible provider got %q: %s", k, sent.Body)
					}
				}
			}

			// One string, and dimensions.
			_, data = rig.do(t, http.MethodPost, "/api/embed", fmt.Sprintf(`{"model":%q,"input":"first text","dimensions":4}`, p.model))
			var one ollamaEmbedAnswer
			decodeStrict(t, data, &one)
			if len(one.Embeddings) != 1 || len(one.Embeddings[0]) != 4 || one.PromptEvalCount != 2 {
				t.Fatalf("dimensions 4: %s", data)
			}

			// The older API: one prompt, one vector, nothing else; an
			// Ollama provider's raw vector (the sim's is the normalized
			// one times 7.25), an OpenAI-compatible one's as it gives it.
			resp, data = rig.do(t, http.MethodPost, "/api/embeddings", fmt.Sprintf(`{"model":%q,"prompt":"first text","keep_alive":300}`, p.model))
			var legacy struct {
				Embedding []float32 `json:"embedding"`
			}
			decodeStrict(t, data, &legacy)
			want := batch[0]
			if p.name == "ollama" {
				want = make([]float32, len(batch[0]))
				for i, v := range batch[0] {
					want[i] = v * 7.25
				}
				if sent := p.proxy.last(t); sent.Path != "/api/embeddings" || !strings.Contains(string(sent.Body), `"prompt":"first text"`) {
					t.Fatalf("the Ollama provider got %s %s", sent.Path, sent.Body)
				}
			}
			if resp.StatusCode != http.StatusOK || !reflect.DeepEqual(legacy.Embedding, want) {
				t.Fatalf("/api/embeddings: %d %s, want the vector %v", resp.StatusCode, data, want)
			}

			// Nothing to embed: a load, answered without the provider.
			p.proxy.mu.Lock()
			before := len(p.proxy.reqs)
			p.proxy.mu.Unlock()
			for path, want := range map[string]string{
				"/api/embed":      fmt.Sprintf(`{"model":%q,"embeddings":[],"total_duration":`, p.model),
				"/api/embeddings": `{"embedding":[]}`,
			} {
				resp, data := rig.do(t, http.MethodPost, path, fmt.Sprintf(`{"model":%q}`, p.model))
				if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(data), want) {
					t.Fatalf("load %s: %d %s, want %s...", path, resp.StatusCode, data, want)
				}
			}
			p.proxy.mu.Lock()
			after := len(p.proxy.reqs)
			p.proxy.mu.Unlock()
			if after != before {
				t.Fatalf("a load reached the provider")
			}
		})
	}
	waitIdle(t, rig.e)
}

func TestOllamaEmbedErrors(t *testing.T) {
	harness.Parallel(t)
	_, plainURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"plain:1b"}})
	rig := startOllamaRig(t, node.ProviderConfig{ID: "plain-1", Type: node.TypeOllama, BaseURL: plainURL, Models: []string{"plain:1b"}, Capacity: 1})
	for _, c := range []struct {
		path, body string
		status     int
		want       string // in the error text
	}{
		{"/api/embed", `{"model":"plain:1b","input":"x"}`, 400, "embeddings"},
		{"/api/embeddings", `{"model":"plain:1b","prompt":"x"}`, 400, "embeddings"},
		{"/api/embed", `{"model":"nope","input":"x"}`, 404, `model 'nope' not found`},
		{"/api/embed", `{"model":"nope"}`, 404, `model 'nope' not found`},
		{"/api/embed", `{"input":"x"}`, 400, "model"},
		{"/api/embed", `{"model":"llama3","input":7}`, 400, "input"},
		{"/api/embed", `{"model":"llama3","input":["a",""]}`, 400, "input[1]"},
		{"/api/embed", `{"model":"llama3","input":"x","dimensions":0}`, 400, "dimensions"},
		{"/api/embed", `{"model":"llama3","input":"x","options":"big"}`, 400, "options"},
		{"/api/embeddings", `{"model":"llama3","prompt":["x"]}`, 400, "prompt"},
	} {
		resp, data := rig.do(t, http.MethodPost, c.path, c.body)
		var e struct {
			Error string `json:"error"`
		}
		decodeStrict(t, data, &e)
		if resp.StatusCode != c.status || !strings.Contains(e.Error, c.want) {
			t.Fatalf("%s %s: %d %s, want %d naming %q", c.path, c.body, resp.StatusCode, data, c.status, c.want)
		}
	}
	waitIdle(t, rig.e)
}
