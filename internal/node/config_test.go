package node

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

func TestLoadConfigExample(t *testing.T) {
	got, err := LoadConfig("testdata/node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		NodeID: "gpu-box-1", Label: "rack 3, 2x A100", Edge: "edge.internal:7443", Token: "s3cret",
		RuntimeConcurrency: 4, ReconnectMin: 500 * time.Millisecond, ReconnectMax: time.Minute, DrainTimeout: 45 * time.Second,
		DiscoveryInterval: 15 * time.Second, ResolveInterval: DefaultResolveInterval,
		Providers: []ProviderConfig{
			{ID: "zero-config", Type: "ollama", BaseURL: "http://127.0.0.1:11435", Capacity: 4, LongCapacity: 4,
				Timeout: DefaultProviderTimeout, DiscoveryInterval: 15 * time.Second},
			{ID: "discovered-vllm", Type: "vllm", BaseURL: "http://127.0.0.1:8001/v1", Capacity: 4, LongCapacity: 4,
				Timeout: DefaultProviderTimeout, DiscoveryInterval: time.Minute},
			{ID: "local-ollama", Type: "ollama", BaseURL: DefaultOllamaURL, Models: []string{"llama3.2:3b", "nomic-embed-text"},
				Capacity: 4, LongCapacity: 4, Capabilities: []string{"embeddings"}, Timeout: DefaultProviderTimeout},
			{ID: "vllm-qwen", Type: "vllm", BaseURL: "http://127.0.0.1:8000/v1", Models: []string{"Qwen/Qwen2.5-7B-Instruct"},
				Capacity: 16, LongCapacity: 4, Capabilities: []string{"tools", "cancel"}, APIKeyEnv: "IOP_TEST_VLLM_KEY", Timeout: 5 * time.Minute},
			{ID: "sim", Type: "sim", Protocol: "openai", BaseURL: "http://127.0.0.1:9999", Models: []string{"sim-model"},
				Capacity: 4, LongCapacity: 4, Timeout: DefaultProviderTimeout},
			{ID: "llm-cli", Type: "cli", Command: []string{"cat", "--model={{model}}"}, PromptVia: PromptViaStdin,
				Env: map[string]string{"LLM_LOG": "off"}, Dir: "/", Models: []string{"cli-model"},
				Capacity: 2, LongCapacity: 2, Timeout: 2 * time.Minute, KillGrace: DefaultKillGrace},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("LoadConfig\n got %+v\nwant %+v", got, want)
	}
	if p := want.Providers[2:]; p[0].path() != nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED ||
		p[1].path() != nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL || p[2].path() != nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL ||
		p[3].path() != nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED {
		t.Error("execution paths")
	}
	for i, p := range got.Providers {
		if p.discovers() != (i < 2) {
			t.Errorf("provider %s discovers: %v", p.ID, p.discovers())
		}
	}
}

func TestLoadConfigDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.yaml")
	os.WriteFile(path, []byte("node_id: n\nedge: 127.0.0.1:1\nproviders:\n  - {id: s, type: sim, base_url: 'http://h:1', models: [m]}\n"), 0o600)
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Providers[0]
	if c.ReconnectMin != DefaultReconnectMin || c.ReconnectMax != DefaultReconnectMax || c.DrainTimeout != 30*time.Second ||
		c.DiscoveryInterval != DefaultDiscoveryInterval ||
		p.Capacity != 1 || p.LongCapacity != 1 || p.Protocol != "ollama" || p.Timeout != DefaultProviderTimeout ||
		p.path() != nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestLoadConfigRejects(t *testing.T) {
	for name, text := range map[string]string{
		"unknown field":  "node_id: n\nedge: h:1\nbogus: 1\n",
		"bad duration":   "node_id: n\nedge: h:1\nreconnect_min: 5\n",
		"not a mapping":  "- 1\n",
		"missing fields": "label: x\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "node.yaml")
			os.WriteFile(path, []byte(text), 0o600)
			if _, err := LoadConfig(path); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("err %v, want ErrInvalidConfig", err)
			}
		})
	}
	if _, err := LoadConfig(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestValidate(t *testing.T) {
	valid := func() Config {
		return Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{
			{ID: "a", Type: "openai", BaseURL: "https://api.example.com/v1", Models: []string{"m"}},
		}}
	}
	if err := valid().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	zeroConfig := Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{{Type: TypeOllama}}}
	if err := zeroConfig.Validate(); err != nil {
		t.Fatalf("a provider with type alone: %v", err)
	}
	edgesOnly := Config{NodeID: "n", Edges: []string{"edges.internal:7443", "10.0.0.9:7443"}, Providers: []ProviderConfig{{Type: TypeOllama}}}
	if err := edgesOnly.Validate(); err != nil {
		t.Fatalf("edges without edge: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no node id", func(c *Config) { c.NodeID = "" }, "node_id"},
		{"no edge", func(c *Config) { c.Edge = "" }, "edge or edges is required"},
		{"edge without port", func(c *Config) { c.Edge = "edge.internal" }, "host:port"},
		{"edges entry without port", func(c *Config) { c.Edges = []string{"edge-a.internal:7443", "edge-b.internal"} }, `edges[1] "edge-b.internal": want host:port`},
		{"edges entry twice", func(c *Config) { c.Edges = []string{"edge-a.internal:7443", "edge-a.internal:7443"} }, "listed twice"},
		{"edges entry same as edge", func(c *Config) { c.Edges = []string{c.Edge} }, "listed twice"},
		{"negative resolve interval", func(c *Config) { c.Edges, c.ResolveInterval = []string{"edges.internal:7443"}, -time.Second }, "resolve_interval -1s"},
		{"no providers", func(c *Config) { c.Providers = nil }, "at least one provider"},
		{"duplicate id", func(c *Config) { c.Providers = append(c.Providers, c.Providers[0]) }, "not unique"},
		{"empty id and type", func(c *Config) { c.Providers[0].ID, c.Providers[0].Type = "", "" }, "id is required"},
		{"unknown type", func(c *Config) { c.Providers[0].Type = "grpc" }, "type \"grpc\""},
		{"cli field on openai", func(c *Config) { c.Providers[0].Command = []string{"cat"} }, "only for type cli"},
		{"kill grace on openai", func(c *Config) { c.Providers[0].KillGrace = time.Second }, "only for type cli"},
		{"protocol on openai", func(c *Config) { c.Providers[0].Protocol = "ollama" }, "only for type sim"},
		{"bad sim protocol", func(c *Config) { c.Providers[0].Type, c.Providers[0].Protocol = "sim", "grpc" }, "protocol \"grpc\""},
		{"no base url", func(c *Config) { c.Providers[0].BaseURL = "" }, "base_url"},
		{"bad base url", func(c *Config) { c.Providers[0].BaseURL = "ftp://x" }, "base_url"},
		{"unparsable base url", func(c *Config) { c.Providers[0].BaseURL = "http://[::1" }, "base_url"},
		{"no models for cli", func(c *Config) {
			c.Providers[0] = ProviderConfig{ID: "c", Type: TypeCLI, Command: []string{"llm"}}
		}, "at least one model is required for type cli"},
		{"discovery interval with models", func(c *Config) { c.Providers[0].DiscoveryInterval = time.Second }, "only for a provider that omits its models"},
		{"negative provider discovery interval", func(c *Config) { c.Providers[0].Models, c.Providers[0].DiscoveryInterval = nil, -time.Second }, "discovery_interval -1s"},
		{"negative discovery interval", func(c *Config) { c.DiscoveryInterval = -time.Second }, "discovery_interval -1s"},
		{"duplicate model", func(c *Config) { c.Providers[0].Models = []string{"m", "m"} }, "listed twice"},
		{"negative capacity", func(c *Config) { c.Providers[0].Capacity = -1 }, "capacity -1"},
		{"negative long capacity", func(c *Config) { c.Providers[0].LongCapacity = -2 }, "long_capacity -2"},
		{"negative runtime concurrency", func(c *Config) { c.RuntimeConcurrency = -1 }, "runtime_concurrency"},
		{"negative timeout", func(c *Config) { c.Providers[0].Timeout = -time.Second }, "timeout"},
		{"reconnect bounds", func(c *Config) { c.ReconnectMin, c.ReconnectMax = time.Second, time.Millisecond }, "reconnect"},
		{"negative drain timeout", func(c *Config) { c.DrainTimeout = -time.Second }, "drain_timeout"},
		{"empty capability", func(c *Config) { c.Providers[0].Capabilities = []string{""} }, "empty capability"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestNewReadsAPIKeyOnce(t *testing.T) {
	cfg := Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{
		{ID: "a", Type: "openai", BaseURL: "http://127.0.0.1:1/v1", Models: []string{"m"}, APIKeyEnv: "IOP_NODE_TEST_KEY"},
	}}
	t.Setenv("IOP_NODE_TEST_KEY", "")
	if _, err := New(cfg, nil); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "IOP_NODE_TEST_KEY") {
		t.Errorf("New with an empty key variable: %v", err)
	}
	t.Setenv("IOP_NODE_TEST_KEY", "sk-1")
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.closeAdapters()
}

func TestValidateCLIProvider(t *testing.T) {
	valid := func() Config {
		return Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{
			{ID: "c", Type: TypeCLI, Command: []string{"llm", "-m", "{{model}}"}, Models: []string{"m"}},
		}}
	}
	c := valid()
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if p := c.withDefaults().Providers[0]; p.PromptVia != PromptViaStdin || p.KillGrace != DefaultKillGrace || p.Timeout != DefaultProviderTimeout || p.BaseURL != "" {
		t.Errorf("cli defaults not applied: %+v", p)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*ProviderConfig)
		want   string
	}{
		{"no command", func(p *ProviderConfig) { p.Command = nil }, "command is required"},
		{"empty executable", func(p *ProviderConfig) { p.Command = []string{"", "x"} }, "command is required"},
		{"placeholder executable", func(p *ProviderConfig) { p.Command = []string{"{{model}}"} }, "cannot be a placeholder"},
		{"unknown placeholder", func(p *ProviderConfig) { p.Command = append(p.Command, "--t={{temperature}}") }, "unknown placeholder {{temperature}}"},
		{"prompt with stdin", func(p *ProviderConfig) { p.Command = append(p.Command, "{{prompt}}") }, "set prompt_via: arg"},
		{"arg without prompt", func(p *ProviderConfig) { p.PromptVia = PromptViaArg }, "needs {{prompt}}"},
		{"bad prompt_via", func(p *ProviderConfig) { p.PromptVia = "file" }, "prompt_via \"file\""},
		{"base_url", func(p *ProviderConfig) { p.BaseURL = "http://h:1" }, "not used by type cli"},
		{"api_key_env", func(p *ProviderConfig) { p.APIKeyEnv = "KEY" }, "not used by type cli"},
		{"env name with =", func(p *ProviderConfig) { p.Env = map[string]string{"A=B": "x"} }, "env \"A=B\""},
		{"NUL in env value", func(p *ProviderConfig) { p.Env = map[string]string{"A": "x\x00"} }, "env \"A\""},
		{"NUL in argument", func(p *ProviderConfig) { p.Command = append(p.Command, "a\x00b") }, "NUL byte"},
		{"negative kill_grace", func(p *ProviderConfig) { p.KillGrace = -time.Second }, "kill_grace"},
		{"embeddings", func(p *ProviderConfig) { p.Capabilities = []string{"embeddings"} }, "capability \"embeddings\""},
		{"tools", func(p *ProviderConfig) { p.Capabilities = []string{"cancel", "tools"} }, "capability \"tools\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c.Providers[0])
			err := c.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate() = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestNewRejectsACLIProviderWhoseExecutableIsMissing(t *testing.T) {
	_, err := New(Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{
		{ID: "c", Type: TypeCLI, Command: []string{"iop-no-such-program"}, Models: []string{"m"}},
	}}, nil)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "not found in PATH") {
		t.Fatalf("New: %v, want ErrInvalidConfig naming the missing executable", err)
	}
}

// TestRegression_ProviderIDDefaultsToItsType: a provider needs no id (a new
// user's zero-config node, `type: ollama` and `base_url` alone, was
// refused "id is required"): it defaults to its type, and to the type and
// a number when that is taken, explicit ids first.
func TestRegression_ProviderIDDefaultsToItsType(t *testing.T) {
	c := Config{NodeID: "n", Edge: "127.0.0.1:7000", Providers: []ProviderConfig{
		{Type: TypeOllama},
		{Type: "openai", BaseURL: "http://127.0.0.1:8000/v1"},
		{Type: TypeOllama, BaseURL: "http://10.0.0.7:11434"},
		{ID: "ollama-2", Type: "vllm", BaseURL: "http://127.0.0.1:8001/v1"},
		{Type: TypeOllama, BaseURL: "http://10.0.0.8:11434"},
	}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range c.withDefaults().Providers {
		ids = append(ids, p.ID)
	}
	if want := []string{"ollama", "openai", "ollama-3", "ollama-2", "ollama-4"}; !slices.Equal(ids, want) {
		t.Fatalf("ids %v, want %v", ids, want)
	}
}
