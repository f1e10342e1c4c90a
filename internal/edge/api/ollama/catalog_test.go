package ollama

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/modelname"
)

// catalogGateway is an apitest.Gateway that is also a ModelCatalog, answering
// from fixed infos and run counts.
type catalogGateway struct {
	*apitest.Gateway
	infos  map[string]contract.ModelInfo
	loaded []contract.LoadedModel
}

var _ ModelCatalog = catalogGateway{}

func (g catalogGateway) ModelInfo(name string) (contract.ModelInfo, bool) {
	if n, ok := modelname.Known(slices.Collect(maps.Keys(g.infos)), name); ok {
		return g.infos[n], true
	}
	return contract.ModelInfo{}, false
}

func (g catalogGateway) Loaded() []contract.LoadedModel { return g.loaded }

// qwen3Details is what an Ollama server says of a qwen3 model, as its node
// passes it on.
var qwen3Details = &contract.ModelDetails{Size: 5225376047, Digest: "500a1f067a9f782620b40bee6f7b0c89e17ae61f686b92c24933e4ca4b2b8b41",
	ModifiedAt: "2026-02-03T04:05:06.789Z", Format: "gguf", Family: "qwen3", Families: []string{"qwen3"},
	ParameterSize: "8.2B", QuantizationLevel: "Q4_K_M", ContextLength: 40960}

// catalogInfos are the models of newCatalogEnv. Their Ollama providers
// (OllamaAPI) are n1/ollama and n2/p (a simulator in its Ollama mode).
func catalogInfos() map[string]contract.ModelInfo {
	qwen := contract.ModelProvider{NodeID: "n1", ProviderID: "ollama", Type: "ollama", Target: "qwen3:latest", Healthy: true, Capacity: 1,
		Capabilities: []string{"completion", "stream", "thinking", "tools"}, Details: qwen3Details, OllamaAPI: true}
	// A second provider of the same model, whose node said nothing of it.
	qwenToo := contract.ModelProvider{NodeID: "n0", ProviderID: "vllm", Type: "vllm", Target: "qwen3:latest", Healthy: true, Capacity: 4,
		Capabilities: []string{"completion", "stream", "vision"}}
	embed := contract.ModelProvider{NodeID: "n1", ProviderID: "ollama", Type: "ollama", Target: "embed:latest", Healthy: true, Capacity: 1,
		Capabilities: []string{"embeddings", "stream"}, Details: &contract.ModelDetails{Size: 45, Digest: "e", Format: "gguf", Family: "bert"},
		OllamaAPI: true}
	return map[string]contract.ModelInfo{
		"qwen3:latest": {Name: "qwen3:latest", Targets: []string{"qwen3:latest"}, Providers: []contract.ModelProvider{qwenToo, qwen}},
		"embed:latest": {Name: "embed:latest", Targets: []string{"embed:latest"}, Providers: []contract.ModelProvider{embed}},
		// An alias: its first target with a provider is qwen3.
		"coder": {Name: "coder", Alias: true, Targets: []string{"nowhere", "qwen3:latest", "embed:latest"},
			Providers: []contract.ModelProvider{qwenToo, qwen, embed}},
		"legacy": {Name: "legacy", Targets: []string{"legacy"}, Providers: []contract.ModelProvider{{NodeID: "n2", ProviderID: "p", Type: "sim",
			Target: "legacy", Capabilities: []string{"completion", "embeddings", "stream"}, OllamaAPI: true}}},
	}
}

func newCatalogEnv(t *testing.T) *testEnv {
	t.Helper()
	fake := &apitest.Gateway{Names: []string{"coder", "embed:latest", "legacy", "qwen3:latest"}, DispatchFunc: okRun}
	gw := catalogGateway{Gateway: fake,
		infos: catalogInfos(),
		loaded: []contract.LoadedModel{
			{NodeID: "n1", ProviderID: "ollama", Type: "ollama", Served: "qwen3:latest", Name: "qwen3:latest", Model: "qwen3:latest",
				Size: qwen3Details.Size, Digest: qwen3Details.Digest, Details: *qwen3Details, ContextLength: 40960,
				Source: contract.LoadedInFlight, InFlight: 2},
			{NodeID: "n1", ProviderID: "ollama", Type: "ollama", Served: "embed:latest", Name: "embed:latest", Model: "embed:latest",
				Size: 900, SizeVRAM: 800, Digest: "e", Details: contract.ModelDetails{Format: "gguf", Family: "bert"},
				ExpiresAt: "2026-02-03T05:00:00Z", ContextLength: 512, LoadedSince: "2026-02-03T04:00:00Z", Source: contract.LoadedReported},
			{NodeID: "n0", ProviderID: "vllm", Type: "vllm", Served: "qwen3:latest", Name: "qwen3:latest", Model: "qwen3:latest",
				Source: contract.LoadedAlways},
		},
	}
	return newEnvWithGateway(t, api.Config{}, gw, fake)
}

// TestOllamaTagsPassDetailsThrough: /api/tags shows the size, digest,
// modified_at and details the serving Ollama said (an alias its first
// target's); a model nobody described keeps the made-up entry.
func TestOllamaTagsPassDetailsThrough(t *testing.T) {
	env := newCatalogEnv(t)
	resp := env.get(t, "/api/tags")
	var tags struct {
		Models []map[string]json.RawMessage `json:"models"`
	}
	if resp.status != 200 || json.Unmarshal([]byte(resp.body), &tags) != nil || len(tags.Models) != 4 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	want := `{"name":"qwen3:latest","model":"qwen3:latest","modified_at":"2026-02-03T04:05:06.789Z","size":5225376047,` +
		`"digest":"500a1f067a9f782620b40bee6f7b0c89e17ae61f686b92c24933e4ca4b2b8b41","details":{"parent_model":"","format":"gguf",` +
		`"family":"qwen3","families":["qwen3"],"parameter_size":"8.2B","quantization_level":"Q4_K_M"}}`
	byName := map[string]string{}
	for _, m := range tags.Models {
		b, _ := json.Marshal(m)
		var name string
		json.Unmarshal(m["name"], &name)
		byName[name] = string(b)
	}
	if got := canonical(t, byName["qwen3:latest"]); got != canonical(t, want) {
		t.Errorf("qwen3 entry\n got %s\nwant %s", got, want)
	}
	// Names are listed with their tag, as Ollama lists them.
	if got := byName["coder:latest"]; !strings.Contains(got, `"digest":"500a1f067a9f782620b40bee6f7b0c89e17ae61f686b92c24933e4ca4b2b8b41"`) || !strings.Contains(got, `"model":"coder:latest"`) {
		t.Errorf("alias entry %s, want its first target's details", got)
	}
	if got := byName["legacy:latest"]; !strings.Contains(got, `"size":0`) || !strings.Contains(got, `"modified_at":"2023-11-14T22:13:20Z"`) {
		t.Errorf("undescribed entry %s", got)
	}
}

// canonical re-encodes a JSON object with sorted keys.
func canonical(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// TestOllamaShowPassesCapabilitiesThrough: /api/show answers the
// capabilities, in Ollama's words, of the model on the providers serving it
// (an embedding model has no "completion"), the details, modified_at and
// context length its server said, and an alias its first target's.
func TestOllamaShowPassesCapabilitiesThrough(t *testing.T) {
	env := newCatalogEnv(t)
	type show struct {
		Capabilities []string       `json:"capabilities"`
		Details      map[string]any `json:"details"`
		ModelInfo    map[string]any `json:"model_info"`
		ModifiedAt   string         `json:"modified_at"`
	}
	get := func(model string) show {
		t.Helper()
		status, _, body := env.ollamaPost(t, "/api/show", `{"model":"`+model+`"}`)
		var s show
		if status != 200 || json.Unmarshal([]byte(body), &s) != nil {
			t.Fatalf("show %s: %d %s", model, status, body)
		}
		return s
	}
	for _, name := range []string{"qwen3", "coder"} {
		s := get(name)
		if !slices.Equal(s.Capabilities, []string{"completion", "vision", "thinking", "tools"}) {
			t.Errorf("%s: capabilities %v", name, s.Capabilities)
		}
		if s.Details["family"] != "qwen3" || s.Details["parameter_size"] != "8.2B" || s.Details["quantization_level"] != "Q4_K_M" ||
			s.ModelInfo["general.architecture"] != "qwen3" || s.ModelInfo["qwen3.context_length"] != float64(40960) ||
			s.ModifiedAt != "2026-02-03T04:05:06.789Z" {
			t.Errorf("%s: %+v", name, s)
		}
	}
	if s := get("embed"); !slices.Equal(s.Capabilities, []string{"embedding"}) || s.Details["family"] != "bert" {
		t.Errorf("embed: %+v", s)
	}
	if s := get("legacy"); !slices.Equal(s.Capabilities, []string{"completion", "embedding"}) || s.ModelInfo["general.architecture"] != "" {
		t.Errorf("legacy: %+v", s)
	}
}

// TestOllamaPSListsWhatProvidersHoldLoaded: /api/ps renders what the
// catalog says is loaded: an Ollama's reported entry with every field it
// said, an OpenAI-compatible provider's model as held for good, a model
// with runs in flight not reported yet with expiry now; each with Ollama's
// fields (none left out) and iop's, longest expiry first.
func TestOllamaPSListsWhatProvidersHoldLoaded(t *testing.T) {
	env := newCatalogEnv(t)
	resp := env.get(t, "/api/ps")
	var ps struct {
		Models []map[string]json.RawMessage `json:"models"`
	}
	if resp.status != http.StatusOK || json.Unmarshal([]byte(resp.body), &ps) != nil || len(ps.Models) != 3 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	now := time.Unix(1700000000, 0).UTC()
	want := []string{
		`{"name":"qwen3:latest","model":"qwen3:latest","size":0,"digest":"` + digestOf("qwen3:latest") + `","details":{"parent_model":"","format":"","family":"",` +
			`"families":null,"parameter_size":"","quantization_level":""},"expires_at":"` + now.Add(ollamaForever).Format(time.RFC3339Nano) + `","size_vram":0,` +
			`"context_length":0,"node_id":"n0","provider_id":"vllm","source":"always","in_flight":0}`,
		`{"name":"embed:latest","model":"embed:latest","size":900,"digest":"e","details":{"parent_model":"","format":"gguf","family":"bert",` +
			`"families":null,"parameter_size":"","quantization_level":""},"expires_at":"2026-02-03T05:00:00Z","size_vram":800,"context_length":512,` +
			`"node_id":"n1","provider_id":"ollama","source":"reported","loaded_since":"2026-02-03T04:00:00Z","in_flight":0}`,
		`{"name":"qwen3:latest","model":"qwen3:latest","size":5225376047,"digest":"500a1f067a9f782620b40bee6f7b0c89e17ae61f686b92c24933e4ca4b2b8b41",` +
			`"details":{"parent_model":"","format":"gguf","family":"qwen3","families":["qwen3"],"parameter_size":"8.2B","quantization_level":"Q4_K_M"},` +
			`"expires_at":"` + now.Format(time.RFC3339Nano) + `","size_vram":0,"context_length":40960,"node_id":"n1","provider_id":"ollama",` +
			`"source":"in_flight","in_flight":2}`,
	}
	for i, m := range ps.Models {
		got, _ := json.Marshal(m)
		if canonical(t, string(got)) != canonical(t, want[i]) {
			t.Errorf("entry %d:\n got %s\nwant %s", i, got, want[i])
		}
	}
}

// digestOf is the digest /api/tags and /api/ps make up for a model whose
// node said none: the SHA-256 of its name.
func digestOf(name string) string {
	sum := sha256.Sum256([]byte(name))
	return hex.EncodeToString(sum[:])
}

// showGateway is a catalogGateway that is also a ModelShower: its Ollama
// providers answer /api/show with answers[provider] (an error when none).
type showGateway struct {
	catalogGateway
	answers map[string]string
	mu      sync.Mutex
	asked   []string // "node/provider/model/verbose", in order
}

func (g *showGateway) Show(_ context.Context, nodeID, providerID, model string, verbose bool) (int, []byte, error) {
	g.mu.Lock()
	g.asked = append(g.asked, nodeID+"/"+providerID+"/"+model+"/"+map[bool]string{true: "verbose", false: "short"}[verbose])
	g.mu.Unlock()
	a, ok := g.answers[providerID]
	if !ok {
		return 0, nil, errors.New("node gone")
	}
	return http.StatusOK, []byte(a), nil
}

// TestOllamaShowPassesOllamasAnswerThrough: a model an Ollama provider
// serves is shown with that Ollama's own answer, byte for byte (verbose
// passed on), asked of the Ollama providers only; when none answers, or
// the model has none, iop's own view is the answer.
func TestOllamaShowPassesOllamasAnswerThrough(t *testing.T) {
	fake := &apitest.Gateway{Names: []string{"coder", "embed:latest", "legacy", "qwen3:latest"}, DispatchFunc: okRun}
	base := catalogGateway{Gateway: fake, infos: catalogInfos()}
	own := `{"modelfile":"FROM qwen3:latest\n","parameters":"temperature 0.6","template":"{{ .Prompt }}","details":{"parent_model":""},` +
		`"model_info":{"general.architecture":"qwen3","qwen3.attention.layer_norm_rms_epsilon":0.000001},"capabilities":["completion"],"modified_at":"x"}`
	gw := &showGateway{catalogGateway: base, answers: map[string]string{"ollama": own}}
	env := newEnvWithGateway(t, api.Config{}, gw, fake)
	for _, tc := range []struct{ body, want, asked string }{
		{`{"model":"qwen3"}`, own, "n1/ollama/qwen3:latest/short"},
		{`{"model":"coder","verbose":true}`, own, "n1/ollama/qwen3:latest/verbose"},
	} {
		gw.asked = nil
		status, _, body := env.ollamaPost(t, "/api/show", tc.body)
		if status != 200 || body != tc.want {
			t.Errorf("%s: %d %s", tc.body, status, body)
		}
		if !slices.Equal(gw.asked, []string{tc.asked}) {
			t.Errorf("%s: asked %v, want [%s] (the vLLM provider is no Ollama)", tc.body, gw.asked, tc.asked)
		}
	}
	// legacy's provider is a simulator (OllamaAPI) that does not answer:
	// iop's own view.
	gw.asked = nil
	status, _, body := env.ollamaPost(t, "/api/show", `{"model":"legacy"}`)
	if status != 200 || !strings.Contains(body, `"iop.providers"`) || len(gw.asked) != 1 {
		t.Errorf("legacy: %d %s, asked %v", status, body, gw.asked)
	}
	if status, _, body := env.ollamaPost(t, "/api/show", `{"model":"nope"}`); status != 404 || strings.TrimSpace(body) != `{"error":"model 'nope' not found"}` {
		t.Errorf("unknown model: %d %s", status, body)
	}
}

// TestRegression_OllamaShowWithoutModelIsOllamasText: /api/show without a
// model is 400 with Ollama's own text, "model is required" (iop said
// "model: model is required").
func TestRegression_OllamaShowWithoutModelIsOllamasText(t *testing.T) {
	env := newCatalogEnv(t)
	for _, body := range []string{`{}`, `{"model":""}`} {
		if status, _, got := env.ollamaPost(t, "/api/show", body); status != 400 || strings.TrimSpace(got) != `{"error":"model is required"}` {
			t.Errorf("%s: %d %s", body, status, got)
		}
	}
}
