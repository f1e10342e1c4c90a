package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"iop/internal/wire/nodev1"
)

// discoveryTimeout bounds each HTTP request discovery makes of a model
// server.
const discoveryTimeout = 10 * time.Second

// maxListingBytes caps one answer of a model server's listing or show
// endpoint.
const maxListingBytes = 16 << 20

// DiscoveredModel is one model a provider's server serves, as discovery
// read it.
type DiscoveredModel struct {
	// Name is the served model name, as the server lists it (Ollama names
	// carry their tag: "llama3.2:latest").
	Name string
	// Capabilities are iop's capability words for the model, as its server
	// says them (Ollama's /api/show "capabilities", see
	// ollamaCapabilities); nil when the server says none (an
	// OpenAI-compatible server, or an /api/show that failed).
	Capabilities []string
	// Details are what the server says of the model (Ollama's /api/tags
	// and /api/show; vLLM's max_model_len), nil when nothing.
	Details *nodev1.ModelDetails
}

// ollamaCapabilities maps Ollama's capability words (/api/show
// "capabilities"; types/model/capability.go of github.com/ollama/ollama)
// to iop's (the capabilities the edge matches requests against). A word
// not listed here passes through unchanged.
var ollamaCapabilities = map[string]string{
	"completion": "completion",
	"tools":      "tools",
	"vision":     "vision",
	"embedding":  "embeddings",
	"thinking":   "thinking",
	"insert":     "insert",
}

// lister reads what one model server serves. Its show cache is used by one
// goroutine at a time (the provider's discovery goroutine, or Discover's
// caller).
type lister struct {
	ollama  bool   // Ollama's API (/api/tags, /api/show); else OpenAI's GET /models
	baseURL string // as configured, without a trailing slash
	apiKey  string // sent as a bearer token when set
	client  *http.Client
	shown   map[string]ollamaShown // Ollama /api/show answers by model name
}

// ollamaShown is what /api/show said of a model whose /api/tags digest
// was digest.
type ollamaShown struct {
	digest        string
	capabilities  []string // iop's words
	parentModel   string
	contextLength int64
}

func newLister(pc ProviderConfig, apiKey string) *lister {
	return &lister{
		ollama:  pc.protocol() == protocolOllama,
		baseURL: strings.TrimSuffix(pc.BaseURL, "/"),
		apiKey:  apiKey,
		client:  &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 2}},
		shown:   make(map[string]ollamaShown),
	}
}

func (l *lister) close() { l.client.CloseIdleConnections() }

// Discover reads, once, what the model server of pc serves, as the agent's
// discovery does on every interval for a provider without models: for type
// ollama (and sim with protocol ollama) GET /api/tags, then POST /api/show
// for each model (capabilities, parent model, context length); for openai
// and vllm (and sim with protocol openai) GET {base_url}/models. The models
// are sorted by name. It sends the key of pc.APIKeyEnv, if set, as a
// bearer token. An error means the server could not be reached, answered
// the listing with a status other than 200, or with a body that is not a
// listing; the failure of a single /api/show leaves that model without
// capabilities. pc.Type cli has nothing to discover (an error).
func Discover(ctx context.Context, pc ProviderConfig) ([]DiscoveredModel, error) {
	pc = Config{Providers: []ProviderConfig{pc}}.withDefaults().Providers[0]
	if _, ok := kindOf(pc.Type); !ok {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, unknownKind(fmt.Sprintf("provider %q", pc.ID), pc.Type))
	}
	if pc.protocol() == protocolNone {
		return nil, fmt.Errorf("%w: provider %q: type %s lists no models", ErrInvalidConfig, pc.ID, pc.Type)
	}
	key := ""
	if pc.APIKeyEnv != "" {
		key = os.Getenv(pc.APIKeyEnv)
	}
	l := newLister(pc, key)
	defer l.close()
	return l.list(ctx)
}

// list reads the models the server serves now, sorted by name.
func (l *lister) list(ctx context.Context) ([]DiscoveredModel, error) {
	var models []DiscoveredModel
	var err error
	if l.ollama {
		models, err = l.listOllama(ctx)
	} else {
		models, err = l.listOpenAI(ctx)
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(models, func(a, b DiscoveredModel) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(models, func(a, b DiscoveredModel) bool { return a.Name == b.Name }), nil
}

// ollamaDetails is the "details" object of Ollama's /api/tags entries and
// /api/show answers (api.ModelDetails of github.com/ollama/ollama).
type ollamaDetails struct {
	ParentModel       string   `json:"parent_model"`
	Format            string   `json:"format"`
	Family            string   `json:"family"`
	Families          []string `json:"families"`
	ParameterSize     string   `json:"parameter_size"`
	QuantizationLevel string   `json:"quantization_level"`
}

// listOllama reads GET /api/tags, and POST /api/show for each model not
// shown yet with its current digest.
func (l *lister) listOllama(ctx context.Context) ([]DiscoveredModel, error) {
	var tags struct {
		Models []struct {
			Name       string        `json:"name"`
			Model      string        `json:"model"`
			ModifiedAt string        `json:"modified_at"`
			Size       int64         `json:"size"`
			Digest     string        `json:"digest"`
			Details    ollamaDetails `json:"details"`
		} `json:"models"`
	}
	if err := l.call(ctx, http.MethodGet, "/api/tags", nil, &tags); err != nil {
		return nil, err
	}
	listed := make(map[string]bool, len(tags.Models))
	var out []DiscoveredModel
	for _, t := range tags.Models {
		name := t.Name
		if name == "" {
			name = t.Model
		}
		if name == "" {
			continue
		}
		listed[name] = true
		d := &nodev1.ModelDetails{
			Size: t.Size, Digest: t.Digest, ModifiedAt: t.ModifiedAt, Format: t.Details.Format, Family: t.Details.Family,
			Families: t.Details.Families, ParameterSize: t.Details.ParameterSize, QuantizationLevel: t.Details.QuantizationLevel,
			ParentModel: t.Details.ParentModel,
		}
		m := DiscoveredModel{Name: name, Details: d}
		s, ok := l.shown[name]
		if !ok || s.digest != t.Digest {
			if fresh, err := l.showOllama(ctx, name, t.Digest); err == nil {
				s, ok = fresh, true
				l.shown[name] = s
			} else if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			// Else keep what an older /api/show said, if anything; the next
			// round asks again.
		}
		if ok {
			m.Capabilities = slices.Clone(s.capabilities)
			d.ContextLength = s.contextLength
			if s.parentModel != "" && !isFilePath(s.parentModel) {
				d.ParentModel = s.parentModel
			}
		}
		out = append(out, m)
	}
	for name := range l.shown {
		if !listed[name] {
			delete(l.shown, name)
		}
	}
	return out, nil
}

// showOllama reads POST /api/show for model.
func (l *lister) showOllama(ctx context.Context, model, digest string) (ollamaShown, error) {
	var show struct {
		Capabilities []string       `json:"capabilities"`
		Details      ollamaDetails  `json:"details"`
		ModelInfo    map[string]any `json:"model_info"`
	}
	body, _ := json.Marshal(map[string]string{"model": model})
	if err := l.call(ctx, http.MethodPost, "/api/show", body, &show); err != nil {
		return ollamaShown{}, err
	}
	s := ollamaShown{digest: digest, parentModel: show.Details.ParentModel, capabilities: []string{}}
	for _, c := range show.Capabilities {
		if w, ok := ollamaCapabilities[c]; ok {
			c = w
		}
		if c != "" && !slices.Contains(s.capabilities, c) {
			s.capabilities = append(s.capabilities, c)
		}
	}
	// model_info holds "<general.architecture>.context_length" (GGUF keys).
	if arch, ok := show.ModelInfo["general.architecture"].(string); ok && arch != "" {
		if n, ok := show.ModelInfo[arch+".context_length"].(float64); ok && n > 0 {
			s.contextLength = int64(n)
		}
	}
	return s, nil
}

// listOpenAI reads GET {base}/models (OpenAI API reference, "List
// models"); vLLM adds each model's max_model_len.
func (l *lister) listOpenAI(ctx context.Context) ([]DiscoveredModel, error) {
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int64  `json:"max_model_len"`
		} `json:"data"`
	}
	if err := l.call(ctx, http.MethodGet, "/models", nil, &list); err != nil {
		return nil, err
	}
	var out []DiscoveredModel
	for _, m := range list.Data {
		if m.ID == "" {
			continue
		}
		dm := DiscoveredModel{Name: m.ID}
		if m.MaxModelLen > 0 {
			dm.Details = &nodev1.ModelDetails{ContextLength: m.MaxModelLen}
		}
		out = append(out, dm)
	}
	return out, nil
}

// call sends one request of discovery (within discoveryTimeout) and
// decodes its 200 answer into out.
func (l *lister) call(ctx context.Context, method, path string, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, l.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if l.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+l.apiKey)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxListingBytes))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: status %d", method, path, resp.StatusCode)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: not a listing: %w", method, path, err)
	}
	return nil
}

// isFilePath reports whether an /api/show parent_model is a path on the
// Ollama host (a model created FROM a GGUF file: Ollama shows its blob's
// path, "/root/.ollama/models/blobs/sha256-...") rather than a model name:
// absolute, or with a Windows drive or separator. Such a path is not passed
// on: it would show the host's file layout to every client, and Ollama's
// own /api/tags says "" there.
func isFilePath(s string) bool {
	return strings.HasPrefix(s, "/") || strings.Contains(s, `\`) || len(s) > 1 && s[1] == ':'
}
