package api

import (
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"

	"iop/internal/edge/contract"
)

// catalogGateway is a fakeGateway that is also a ModelCatalog, answering
// from fixed infos and run counts.
type catalogGateway struct {
	*fakeGateway
	infos    map[string]ModelInfo
	inFlight map[string]int
}

var _ ModelCatalog = catalogGateway{}

func (g catalogGateway) ModelInfo(name string) (ModelInfo, bool) {
	if n, ok := knownModel(slices.Collect(maps.Keys(g.infos)), name); ok {
		return g.infos[n], true
	}
	return ModelInfo{}, false
}

func (g catalogGateway) RunsInFlight() map[string]int { return g.inFlight }

// qwen3Details is what an Ollama server says of a qwen3 model, as its node
// passes it on.
var qwen3Details = &contract.ModelDetails{Size: 5225376047, Digest: "500a1f067a9f782620b40bee6f7b0c89e17ae61f686b92c24933e4ca4b2b8b41",
	ModifiedAt: "2026-02-03T04:05:06.789Z", Format: "gguf", Family: "qwen3", Families: []string{"qwen3"},
	ParameterSize: "8.2B", QuantizationLevel: "Q4_K_M", ContextLength: 40960}

func newCatalogEnv(t *testing.T) *testEnv {
	t.Helper()
	fake := &fakeGateway{models: []string{"coder", "embed:latest", "legacy", "qwen3:latest"}, dispatch: okRun}
	qwen := ModelProvider{NodeID: "n1", ProviderID: "ollama", Type: "ollama", Target: "qwen3:latest", Healthy: true, Capacity: 1,
		Capabilities: []string{"completion", "stream", "thinking", "tools"}, Details: qwen3Details}
	// A second provider of the same model, whose node said nothing of it.
	qwenToo := ModelProvider{NodeID: "n0", ProviderID: "vllm", Type: "vllm", Target: "qwen3:latest", Healthy: true, Capacity: 4,
		Capabilities: []string{"completion", "stream", "vision"}}
	embed := ModelProvider{NodeID: "n1", ProviderID: "ollama", Type: "ollama", Target: "embed:latest", Healthy: true, Capacity: 1,
		Capabilities: []string{"embeddings", "stream"}, Details: &contract.ModelDetails{Size: 45, Digest: "e", Format: "gguf", Family: "bert"}}
	gw := catalogGateway{fakeGateway: fake,
		infos: map[string]ModelInfo{
			"qwen3:latest": {Name: "qwen3:latest", Targets: []string{"qwen3:latest"}, Providers: []ModelProvider{qwenToo, qwen}},
			"embed:latest": {Name: "embed:latest", Targets: []string{"embed:latest"}, Providers: []ModelProvider{embed}},
			// An alias: its first target with a provider is qwen3.
			"coder": {Name: "coder", Alias: true, Targets: []string{"nowhere", "qwen3:latest", "embed:latest"},
				Providers: []ModelProvider{qwenToo, qwen, embed}},
			"legacy": {Name: "legacy", Targets: []string{"legacy"}, Providers: []ModelProvider{{NodeID: "n2", ProviderID: "p", Type: "sim",
				Target: "legacy", Capabilities: []string{"completion", "embeddings", "stream"}}}},
		},
		inFlight: map[string]int{"qwen3:latest": 2},
	}
	return newEnvWithGateway(t, Config{}, gw, fake)
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

// TestOllamaPSPassesDetailsThrough: /api/ps lists the models with runs in
// flight with the size, digest, details and context length their server
// said.
func TestOllamaPSPassesDetailsThrough(t *testing.T) {
	env := newCatalogEnv(t)
	resp := env.get(t, "/api/ps")
	var ps struct {
		Models []struct {
			Name          string             `json:"name"`
			Size          int64              `json:"size"`
			Digest        string             `json:"digest"`
			Details       ollamaModelDetails `json:"details"`
			ContextLength int64              `json:"context_length"`
			ExpiresAt     string             `json:"expires_at"`
			ModifiedAt    *string            `json:"modified_at"`
			InFlight      int                `json:"in_flight"`
		} `json:"models"`
	}
	if resp.status != http.StatusOK || json.Unmarshal([]byte(resp.body), &ps) != nil || len(ps.Models) != 1 {
		t.Fatalf("%d %s", resp.status, resp.body)
	}
	m := ps.Models[0]
	if m.Name != "qwen3:latest" || m.Size != qwen3Details.Size || m.Digest != qwen3Details.Digest || m.Details.Family != "qwen3" ||
		m.ContextLength != 40960 || m.InFlight != 2 || m.ExpiresAt == "" || m.ModifiedAt != nil {
		t.Fatalf("ps entry %+v", m)
	}
}
