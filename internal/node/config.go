package node

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"iop/internal/node/adapter"
	"iop/internal/node/managed"
	"iop/internal/tracing"
)

// Defaults applied to zero fields of Config and ProviderConfig.
const (
	DefaultReconnectMin    = 200 * time.Millisecond
	DefaultReconnectMax    = 10 * time.Second
	DefaultDrainTimeout    = 30 * time.Second // grace period of a drain (Agent.Drain)
	DefaultProviderTimeout = 10 * time.Minute
	DefaultOllamaURL       = "http://127.0.0.1:11434"
	DefaultKillGrace       = adapter.DefaultKillGrace // type cli: SIGTERM to SIGKILL
	// DefaultDiscoveryInterval is how often the models and health of a
	// provider that omits its models are read again.
	DefaultDiscoveryInterval = 30 * time.Second
	// DefaultResolveInterval is how often the DNS names of Config.Edges
	// are looked up again.
	DefaultResolveInterval = 30 * time.Second
)

// Provider types; providerKinds (kinds.go) says what each one is.
const (
	TypeOllama  = "ollama"  // Ollama's native API, normalized path
	TypeOpenAI  = "openai"  // any OpenAI-compatible server, tunnel path
	TypeVLLM    = "vllm"    // vLLM's OpenAI-compatible server, tunnel path
	TypeSim     = "sim"     // an `iop sim` server; path by ProviderConfig.Protocol
	TypeCLI     = "cli"     // a local command-line program, normalized path
	TypeManaged = "managed" // OpenAI-compatible servers the node starts per model, tunnel path
)

// How a cli provider passes the prompt to its command (ProviderConfig.PromptVia).
const (
	PromptViaStdin = adapter.PromptViaStdin // written to the command's standard input, then closed
	PromptViaArg   = adapter.PromptViaArg   // substituted for {{prompt}} in the command's arguments
)

// Config is a node agent's configuration, read from YAML by LoadConfig.
//
//	node_id: gpu-box-1
//	label: "rack 3, 2x A100"
//	edge: edge.internal:7443            # one edge; or, for several:
//	# edges: [edge-a.internal:7443, edge-b.internal:7443, edges.internal:7443]
//	# resolve_interval: 30s              # how often names in edges are looked up again
//	token: s3cret
//	tls_ca: /etc/iop/edge-ca.crt        # TLS to the edge, trusting this CA
//	tls_server_name: edge.internal      # default: the host of edge
//	tls_cert: /etc/iop/gpu-box-1.crt    # mutual TLS: the node's certificate
//	tls_key: /etc/iop/gpu-box-1.key
//	runtime_concurrency: 4
//	reconnect_min: 200ms
//	reconnect_max: 10s
//	drain_timeout: 30s                   # on SIGTERM: how long runs in flight may take
//	discovery_interval: 30s
//	providers:
//	  - id: local-ollama                # models omitted: every model the server lists
//	    type: ollama
//	    base_url: http://127.0.0.1:11434
//	  - id: other-ollama
//	    type: ollama
//	    base_url: http://10.0.0.7:11434
//	    models: [llama3.2:3b, nomic-embed-text]
//	    capacity: 2
//	    capabilities: [embeddings]
//	  - id: vllm-qwen
//	    type: vllm
//	    base_url: http://127.0.0.1:8000/v1
//	    models: [Qwen/Qwen2.5-7B-Instruct]
//	    capacity: 16
//	    long_capacity: 4
//	    capabilities: [tools]
//	    api_key_env: VLLM_API_KEY
//	    timeout: 5m
//	  - id: llm-cli
//	    type: cli
//	    command: [llm, -m, "{{model}}"]
//	    prompt_via: stdin
//	    env: {LLM_USER_PATH: /srv/llm}
//	    dir: /srv/llm
//	    models: [gpt-4o-mini]
//	    capacity: 2
//	    timeout: 2m
//	    kill_grace: 5s
//	  - id: llama                       # servers started on demand, one per model
//	    type: managed
//	    max_loaded_models: 1
//	    servers:
//	      qwen2.5-7b:
//	        cmd: [llama-server, -m, /models/qwen2.5-7b.gguf, --port, "${PORT}", --alias, "${MODEL}"]
//	        ttl: 10m
type Config struct {
	// NodeID names the node to the edge. Required.
	NodeID string `yaml:"node_id"`
	// Label is a free-form description shown in status views.
	Label string `yaml:"label"`
	// Edge is host:port of the edge's node endpoint (gRPC; plaintext
	// unless TLS is configured below): one edge, dialed by that name as
	// gRPC dials it. Edge or Edges is required; with both, Edge is one
	// more entry of Edges.
	Edge string `yaml:"edge"`
	// Edges are the node endpoints of several edges (host:port each); the
	// node keeps one connection to every edge (edges.go). An entry whose
	// host is a DNS name stands for every edge the name resolves to: the
	// node connects to each address (IPv4 ones when the name has any,
	// else IPv6: a host with both is one edge, not two), verifies TLS
	// against the name, and looks the name up again every
	// ResolveInterval.
	Edges []string `yaml:"edges"`
	// ResolveInterval is how often the names in Edges are looked up again
	// (an address that appears gets a connection; one that is gone has its
	// connection drained, then closed); 0 means 30s.
	ResolveInterval time.Duration `yaml:"resolve_interval"`
	// Token authenticates the node to the edge, sent in Hello.
	Token string `yaml:"token"`
	// TLS dials the edge over TLS, verifying its certificate against the
	// system's roots (or TLSCA). Setting TLSCA or TLSCert implies it.
	TLS bool `yaml:"tls"`
	// TLSCA is a PEM file of the CA(s) the edge's certificate must chain
	// to (instead of the system's roots).
	TLSCA string `yaml:"tls_ca"`
	// TLSServerName is the name the edge's certificate must carry; default
	// the host part of Edge.
	TLSServerName string `yaml:"tls_server_name"`
	// TLSCert and TLSKey are PEM files of the node's client certificate
	// and key, for an edge that requires mutual TLS (client_ca).
	TLSCert string `yaml:"tls_cert"`
	TLSKey  string `yaml:"tls_key"`
	// RuntimeConcurrency is the capacity of a provider that sets none;
	// 0 means 1.
	RuntimeConcurrency int `yaml:"runtime_concurrency"`
	// Providers are the model servers this node drives; at least one.
	Providers []ProviderConfig `yaml:"providers"`
	// ReconnectMin and ReconnectMax bound the exponential reconnect
	// backoff (full jitter); defaults 200ms and 10s.
	ReconnectMin time.Duration `yaml:"reconnect_min"`
	ReconnectMax time.Duration `yaml:"reconnect_max"`
	// DrainTimeout is the grace period of a drain (Agent.Drain; `iop
	// node` drains on SIGTERM or SIGINT): the runs in flight may take this
	// long to finish before they are aborted. 0 means 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// DiscoveryInterval is how often the agent reads again the models and
	// health of each provider that omits its models (a provider may set its
	// own); default 30s.
	DiscoveryInterval time.Duration `yaml:"discovery_interval"`
	// Tracing exports OpenTelemetry traces of the runs (package tracing;
	// docs/observability.md, "Tracing"): off unless an endpoint is set here or in
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT. A field set here wins over its
	// environment variable. The process reads it (node.New does not).
	Tracing tracing.Config `yaml:"tracing"`
	// Version is reported in Hello; set by the binary, not by YAML.
	// Default: the main module's version from the build info, else "dev".
	Version string `yaml:"-"`
}

// ProviderConfig is one model server the node drives.
type ProviderConfig struct {
	// ID is unique within the node. Default: the provider's type ("ollama",
	// "openai", ...), or the type and its position among the providers
	// without an id of that type ("ollama-2", ...) when that is taken.
	ID string `yaml:"id"`
	// Type is ollama, openai, vllm, sim, cli or managed. Required.
	Type string `yaml:"type"`
	// Protocol, for type sim only, is the simulator's wire protocol:
	// "ollama" (default; normalized path) or "openai" (tunnel path).
	Protocol string `yaml:"protocol"`
	// BaseURL is the server's root, http or https: for ollama the server
	// (default http://127.0.0.1:11434), for openai and vllm the API root
	// that "/chat/completions" is appended to (e.g. http://host:8000/v1).
	// Not used by type cli.
	BaseURL string `yaml:"base_url"`
	// Models are the served model names. Omitted (for any type but cli),
	// the agent discovers them: every model the server lists (Ollama's
	// GET /api/tags, with each model's capabilities and details from
	// POST /api/show; an OpenAI-compatible server's GET {base_url}/models),
	// read again every DiscoveryInterval, together with the server's health
	// (a server that does not answer its listing is unhealthy, out of
	// rotation, until it does). With models set, the provider serves
	// exactly those and is taken as healthy: nothing is read from it.
	Models []string `yaml:"models"`
	// Capacity is the most concurrent requests; 0 means the node's
	// runtime_concurrency, else 1.
	Capacity int `yaml:"capacity"`
	// LongCapacity is the most concurrent long-context requests; 0 means
	// Capacity.
	LongCapacity int `yaml:"long_capacity"`
	// MaxLoadedModels is how many models the provider's server holds
	// loaded at once (Ollama's OLLAMA_MAX_LOADED_MODELS), told to the edge
	// so its scheduler predicts evictions; 0 means unknown (the edge learns
	// it from the server's /api/ps readings).
	MaxLoadedModels int `yaml:"max_loaded_models"`
	// CostWeight is what one second of one of its slots counts as in
	// GPU-time (the edge's gpu_seconds quotas): a provider on a GPU twice
	// as costly says 2; 0 means 1. Told to the edge.
	CostWeight float64 `yaml:"cost_weight"`
	// Capabilities are advertised in addition to "stream", which every
	// provider has: cancel, tools, vision, embeddings, background, ... For
	// a provider whose models are discovered, each model has the
	// capabilities its server says (Ollama's /api/show: completion, tools,
	// vision, embedding, thinking, insert), unless Capabilities is set:
	// then every model has these instead.
	Capabilities []string `yaml:"capabilities"`
	// DiscoveryInterval, for a provider that omits its models, overrides
	// the node's discovery_interval; 0 means the node's.
	DiscoveryInterval time.Duration `yaml:"discovery_interval"`
	// APIKeyEnv names the environment variable holding the provider's API
	// key, read once when the agent is built; empty means no key.
	APIKeyEnv string `yaml:"api_key_env"`
	// Timeout bounds a whole provider request (for type cli, the whole
	// run of the command); 0 means 10m.
	Timeout time.Duration `yaml:"timeout"`

	// The fields below are for type cli only; see adapter.CLIConfig for
	// how a run uses them.

	// Command is the executable (a name looked up in PATH, or a path,
	// relative to Dir when relative) and its argument template. "{{model}}"
	// in an argument becomes the served model, "{{prompt}}" the prompt
	// (prompt_via arg only); no other "{{...}}" placeholder exists. No
	// shell is involved. Required for type cli.
	Command []string `yaml:"command"`
	// PromptVia is how the prompt reaches the command: "stdin" (default)
	// or "arg" (Command must then hold "{{prompt}}").
	PromptVia string `yaml:"prompt_via"`
	// Env is added to the command's environment, which otherwise holds
	// only PATH, HOME, USER, LOGNAME, SHELL, TMPDIR, TZ, LANG and LC_* from
	// the node's own environment (see adapter.CLIConfig).
	Env map[string]string `yaml:"env"`
	// Dir is the command's working directory; empty means the node's.
	Dir string `yaml:"dir"`
	// KillGrace is how long a cancelled command's process group (type
	// managed: a stopped model server's) has between SIGTERM and SIGKILL;
	// 0 means 5s (type managed: 10s).
	KillGrace time.Duration `yaml:"kill_grace"`

	// Servers, for type managed only, are the model servers the node
	// starts itself, by served model name (package managed: the command
	// line, environment, url, health_url, ttl and start_timeout of each).
	// The provider's models are their names; MaxLoadedModels (default 1) is
	// how many run at once; a run for another model stops the least
	// recently used idle one.
	Servers map[string]managed.Server `yaml:"servers"`
}

// LoadConfig reads a YAML config from path, rejects unknown fields, applies
// the defaults and validates it. Errors wrap ErrInvalidConfig for content
// problems; file errors are returned as they are.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, path, err)
	}
	c = c.withDefaults()
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// withDefaults returns c with every documented default filled in.
// defaultProviderIDs gives every provider without an id one from its type:
// the type itself when no provider has it as its id, else the type
// followed by "-2", "-3", ... (the first free one), in provider order. A
// provider without a type keeps no id (Validate reports it).
func defaultProviderIDs(ps []ProviderConfig) {
	taken := make(map[string]bool, len(ps))
	for _, p := range ps {
		if p.ID != "" {
			taken[p.ID] = true
		}
	}
	for i := range ps {
		p := &ps[i]
		if p.ID != "" || p.Type == "" {
			continue
		}
		id := p.Type
		for n := 2; taken[id]; n++ {
			id = fmt.Sprintf("%s-%d", p.Type, n)
		}
		p.ID, taken[id] = id, true
	}
}

// WithDefaults returns c with every documented default filled in (provider
// ids from their types, intervals, ...), as the agent runs it.
func (c Config) WithDefaults() Config { return c.withDefaults() }

func (c Config) withDefaults() Config {
	if c.ReconnectMin == 0 {
		c.ReconnectMin = DefaultReconnectMin
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = max(DefaultReconnectMax, c.ReconnectMin)
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.DiscoveryInterval == 0 {
		c.DiscoveryInterval = DefaultDiscoveryInterval
	}
	if c.ResolveInterval == 0 {
		c.ResolveInterval = DefaultResolveInterval
	}
	c.Providers = slices.Clone(c.Providers)
	defaultProviderIDs(c.Providers)
	for i := range c.Providers {
		p := &c.Providers[i]
		if k, ok := kindOf(p.Type); ok && k.defaults != nil {
			k.defaults(p)
		}
		if p.Capacity == 0 {
			p.Capacity = max(c.RuntimeConcurrency, 1)
		}
		if p.LongCapacity == 0 {
			p.LongCapacity = p.Capacity
		}
		if p.Timeout == 0 {
			p.Timeout = DefaultProviderTimeout
		}
		if p.discovers() && p.DiscoveryInterval == 0 {
			p.DiscoveryInterval = c.DiscoveryInterval
		}
	}
	return c
}

// Validate reports every problem of c (with defaults applied), joined and
// wrapped in ErrInvalidConfig: node_id set, edge or edges set (each host:port, none twice), at least
// one provider, provider ids unique and non-empty, a known type (and sim
// protocol), a base_url that parses as http(s) with a host (none for type
// cli), models non-empty and unique (at least one for type cli; other
// types may omit them, to be discovered), capacities and durations not
// negative (discovery_interval only on a provider that omits its models),
// reconnect bounds ordered. For type cli (see validateCLI): a
// command, a known prompt_via and placeholders, env names usable in an
// environment, no embeddings, tools or vision capability; the cli fields
// are refused on other types. Whether the executable and dir exist is
// checked when the agent is built (node.New).
func (c Config) Validate() error { return c.validate(false) }

// ValidateLocal is Validate for a node in the edge's own process
// (WithGateway): it takes no edge or edges.
func (c Config) ValidateLocal() error { return c.validate(true) }

// validate is Validate for a node whose edge is in its own process
// (inProcess, WithGateway): it then takes no edge or edges.
func (c Config) validate(inProcess bool) error {
	c = c.withDefaults()
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.NodeID == "" {
		bad("node_id is required")
	}
	switch {
	case inProcess && (c.Edge != "" || len(c.Edges) > 0):
		bad("edge and edges are not used by a node in the edge's own process")
	case !inProcess && c.Edge == "" && len(c.Edges) == 0:
		bad("edge or edges is required")
	}
	if c.Edge != "" {
		if host, port, err := net.SplitHostPort(c.Edge); err != nil || host == "" || port == "" {
			bad("edge %q: want host:port", c.Edge)
		}
	}
	seenEdge := map[string]bool{c.Edge: c.Edge != ""}
	for i, e := range c.Edges {
		if host, port, err := net.SplitHostPort(e); err != nil || host == "" || port == "" {
			bad("edges[%d] %q: want host:port", i, e)
		} else if seenEdge[e] {
			bad("edges[%d] %q: listed twice (one connection per edge)", i, e)
		}
		seenEdge[e] = true
	}
	if c.ResolveInterval < 0 {
		bad("resolve_interval %v: must not be negative", c.ResolveInterval)
	}
	if c.RuntimeConcurrency < 0 {
		bad("runtime_concurrency %d: must not be negative", c.RuntimeConcurrency)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("tls_cert and tls_key go together")
	}
	if c.ReconnectMin <= 0 || c.ReconnectMax < c.ReconnectMin {
		bad("reconnect_min %v, reconnect_max %v: want 0 < min <= max", c.ReconnectMin, c.ReconnectMax)
	}
	if c.DrainTimeout < 0 {
		bad("drain_timeout %v: must not be negative", c.DrainTimeout)
	}
	if c.DiscoveryInterval < 0 {
		bad("discovery_interval %v: must not be negative", c.DiscoveryInterval)
	}
	if len(c.Providers) == 0 {
		bad("at least one provider is required")
	}
	ids := make(map[string]bool)
	for i, p := range c.Providers {
		name := fmt.Sprintf("providers[%d]", i)
		if p.ID == "" {
			bad("%s: id is required", name)
		} else if ids[p.ID] {
			bad("%s: id %q is not unique", name, p.ID)
		} else {
			name = fmt.Sprintf("provider %q", p.ID)
		}
		ids[p.ID] = true
		if k, ok := kindOf(p.Type); ok {
			errs = append(errs, k.validate(p, name)...)
		} else {
			errs = append(errs, unknownKind(name, p.Type))
		}
		if len(p.Servers) > 0 && p.Type != TypeManaged {
			bad("%s: servers is only for type managed", name)
		}
		if p.DiscoveryInterval < 0 {
			bad("%s: discovery_interval %v: must not be negative", name, p.DiscoveryInterval)
		} else if p.DiscoveryInterval > 0 && !p.discovers() {
			bad("%s: discovery_interval is only for a provider that omits its models", name)
		}
		seen := make(map[string]bool)
		for _, m := range p.Models {
			if m == "" || seen[m] {
				bad("%s: model %q is empty or listed twice", name, m)
			}
			seen[m] = true
		}
		if p.Capacity < 0 || p.LongCapacity < 0 {
			bad("%s: capacity %d, long_capacity %d: must not be negative", name, p.Capacity, p.LongCapacity)
		}
		if p.MaxLoadedModels < 0 {
			bad("%s: max_loaded_models %d: must not be negative", name, p.MaxLoadedModels)
		}
		if p.CostWeight < 0 || math.IsNaN(p.CostWeight) || math.IsInf(p.CostWeight, 0) || p.CostWeight > 1e6 {
			bad("%s: cost_weight %v: must be a number from 0 (meaning 1) to 1e6", name, p.CostWeight)
		}
		if p.Timeout < 0 {
			bad("%s: timeout %v: must not be negative", name, p.Timeout)
		}
		if slices.Contains(p.Capabilities, "") {
			bad("%s: empty capability", name)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// placeholder matches one "{{...}}" in a cli argument template.
var placeholder = regexp.MustCompile(`\{\{[^{}]*\}\}`)

// validateCLI returns the problems of p, of type cli, that name describes.
func (p ProviderConfig) validateCLI(name string) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.Protocol != "" || p.BaseURL != "" || p.APIKeyEnv != "" {
		bad("%s: protocol, base_url and api_key_env are not used by type cli", name)
	}
	if len(p.Command) == 0 || p.Command[0] == "" {
		bad("%s: command is required for type cli: the executable, then its arguments", name)
	} else if strings.Contains(p.Command[0], "{{") {
		bad("%s: command[0] %q: the executable cannot be a placeholder", name, p.Command[0])
	}
	prompts := 0
	for i, arg := range p.Command {
		if strings.IndexByte(arg, 0) >= 0 {
			bad("%s: command[%d] holds a NUL byte", name, i)
		}
		for _, ph := range placeholder.FindAllString(arg, -1) {
			switch ph {
			case "{{model}}":
			case "{{prompt}}":
				prompts++
			default:
				bad("%s: command[%d]: unknown placeholder %s: want {{model}} or {{prompt}}", name, i, ph)
			}
		}
	}
	switch p.PromptVia {
	case PromptViaStdin:
		if prompts > 0 {
			bad("%s: command holds {{prompt}} but prompt_via is stdin: set prompt_via: arg", name)
		}
	case PromptViaArg:
		if prompts == 0 {
			bad("%s: prompt_via arg needs {{prompt}} in command", name)
		}
	default:
		bad("%s: prompt_via %q: want stdin or arg", name, p.PromptVia)
	}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(p.Env[k], 0) >= 0 {
			bad("%s: env %q: a name must be non-empty without '=' or NUL, a value without NUL", name, k)
		}
	}
	if p.KillGrace < 0 {
		bad("%s: kill_grace %v: must not be negative", name, p.KillGrace)
	}
	for _, c := range []string{"embeddings", "tools", "vision"} {
		if slices.Contains(p.Capabilities, c) {
			bad("%s: capability %q: a cli provider answers text prompts only", name, c)
		}
	}
	return errs
}

// capabilities is "stream" followed by p.Capabilities, without repeats.
func (p ProviderConfig) capabilities() []string {
	out := []string{"stream"}
	for _, c := range p.Capabilities {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}
