package process

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"iop/internal/auth"
	"iop/internal/edge"
	"iop/internal/edge/api"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/tracing"
)

// DevConfig configures ModeDev (`iop dev`): an edge and an in-process node
// in one process, reaching each other in memory (package memlink: the
// connection, generations and runs of a remote node, without gRPC). Its
// YAML shape (`iop dev --config`) uses the field names below.
type DevConfig struct {
	Listen     string `yaml:"listen"`      // HTTP API address
	NodeListen string `yaml:"node_listen"` // node endpoint address; default an ephemeral loopback port
	ForceSim   bool   `yaml:"sim"`         // use the simulator even if a local Ollama answers
	OllamaURL  string `yaml:"ollama_url"`  // where to look for a local Ollama; "" = never
	// DiscoveryInterval is how often the node reads the local Ollama's
	// models and health again; 0 means the node's default (30s).
	DiscoveryInterval time.Duration `yaml:"discovery_interval"`
	// The simulated providers: capacity each, token rate (tokens/s) and
	// time to first token.
	SimCapacity        int           `yaml:"sim_capacity"`
	SimTokensPerSecond float64       `yaml:"sim_tokens_per_second"`
	SimTTFT            time.Duration `yaml:"sim_ttft"`
	// SimMaxTokens is the length, in tokens, of a simulated answer whose
	// request asks for more (or sets no max_tokens); 0 means the
	// simulator's default (16).
	SimMaxTokens int `yaml:"sim_max_tokens"`
	// SimThinking makes the simulated models think before they answer,
	// in each protocol's format (iop sim --thinking).
	SimThinking bool `yaml:"sim_thinking"`
	// SimPrefixCacheTokens and SimPrefillTokensPerSecond give each
	// simulated provider a prefix cache and a prefill rate (iop sim
	// --prefix-cache-tokens, --prefill-tokens-per-second), to watch prefix
	// routing at work; 0 means none.
	SimPrefixCacheTokens      int     `yaml:"sim_prefix_cache_tokens"`
	SimPrefillTokensPerSecond float64 `yaml:"sim_prefill_tokens_per_second"`
	// The HTTP API's limits, as in the edge config: the largest request
	// body (bytes) and the write timeout; 0 means the edge's default.
	MaxBodyBytes int64         `yaml:"max_body_bytes"`
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// DrainTimeout is how long Ctrl-C lets requests in flight finish; 0
	// means the edge's default (30s).
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// Database is the SQLite file of run records; "" keeps them in memory.
	Database string `yaml:"database"`
	// APIKey, when set, is the one client API key the edge accepts (as
	// "Authorization: Bearer KEY" or "x-api-key: KEY"); empty leaves the
	// client API open (then served on loopback only unless InsecureOpen).
	APIKey string `yaml:"api_key"`
	// InsecureOpen allows an open client API on a non-loopback address.
	InsecureOpen bool `yaml:"insecure_open"`
}

// Names used by the simulated providers of `iop dev`.
const (
	devAlias       = "demo"
	devOllamaModel = "sim-ollama"
	devOpenAIModel = "sim-openai"
)

// DevInfo is what a running ModeDev process serves.
type DevInfo struct {
	Sims    []*sim.Server // the simulated providers, if used
	Model   string        // the model name to try
	Models  []string      // the served model names behind it
	Summary string        // what serves it, for people
	APIKey  string        // the client key required, "" for none
}

// devProcess is `iop dev` (ModeDev): the simulated providers (unless a
// local Ollama answers and ForceSim is off), an edge, and an in-process
// node reporting version. Its resources are the steps Open lists; Shutdown
// closes them in reverse.
type devProcess struct {
	DevInfo
	version string
	hook    func(phase, name string) error
	hangup  <-chan os.Signal
	load    func() (DevConfig, error) // Config.ReloadDev; nil: nothing to read again
	stdout  io.Writer                 // the banner's; nil: none

	// Set by the open steps, in order; read-only once Open has returned.
	Edge      *edgeProcess
	Agent     *node.Agent
	providers []node.ProviderConfig // the in-process node's
	ntr       *tracing.Tracing
	local     *localNode
	stopWatch func()
	steps     steps

	logger  *slog.Logger
	mu      sync.Mutex  // serializes reload; guards the fields below
	cfg     DevConfig   // as running
	nodeCfg node.Config // the in-process node's, as running
}

// reload applies next, iop dev's configuration read again: its api_key
// (the client and admin key, at once) and discovery_interval (the
// in-process node's); every other changed setting is logged as applying
// at the next start. A next that is refused changes nothing.
func (d *devProcess) reload(next DevConfig, trigger string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var keys []auth.Key
	if next.APIKey != "" {
		keys = []auth.Key{{Name: "dev", Hash: auth.Hash(next.APIKey)}}
	} else if !isLoopback(d.cfg.Listen) && !next.InsecureOpen {
		return fmt.Errorf("the new config has no api_key: it would open the HTTP API on %s to anyone (set insecure_open to mean it)", d.cfg.Listen)
	}
	nodeCfg := d.nodeCfg
	nodeCfg.DiscoveryInterval = next.DiscoveryInterval
	res, err := d.Agent.Reload(nodeCfg)
	if err != nil {
		return err
	}
	if err := d.Edge.Keys.Replace(keys); err != nil {
		return err
	}
	if err := d.Edge.AdminKeys.Replace(keys); err != nil {
		return err
	}
	was, is := d.cfg, next
	was.APIKey, was.DiscoveryInterval, was.InsecureOpen = "", 0, false
	is.APIKey, is.DiscoveryInterval, is.InsecureOpen = "", 0, false
	restart := changedFields(was, is)
	keyChanged := d.cfg.APIKey != next.APIKey
	d.cfg.APIKey, d.cfg.DiscoveryInterval, d.cfg.InsecureOpen = next.APIKey, next.DiscoveryInterval, next.InsecureOpen
	d.nodeCfg = nodeCfg
	log := d.logger.With("component", "config")
	log.Info("config reloaded", "trigger", trigger, "api_key_changed", keyChanged, "applied", res.Applied)
	if len(restart) > 0 {
		log.Warn("config settings changed that apply only after a restart; they keep their running values", "settings", restart)
	}
	return nil
}

// changedFields names the YAML keys of the fields that differ between a
// and b, two values of one struct type.
func changedFields(a, b any) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := range va.NumField() {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			name, _, _ := strings.Cut(va.Type().Field(i).Tag.Get("yaml"), ",")
			out = append(out, name)
		}
	}
	return out
}

// printBanner tells a person where iop dev listens and what to try.
func printBanner(out io.Writer, d *devProcess) {
	base := "http://" + d.Edge.HTTPAddr
	authHeader := ""
	if d.APIKey != "" {
		authHeader = " -H 'Authorization: Bearer " + d.APIKey + "'"
	}
	fmt.Fprintf(out, "\niop dev is ready: %s\n", d.Summary)
	fmt.Fprintf(out, "  OpenAI-compatible API: %s/v1   (node endpoint for more nodes: %s)\n", base, d.Edge.NodeAddr)
	fmt.Fprintf(out, "  try:\n")
	fmt.Fprintf(out, "    curl -N %s/v1/chat/completions%s -H 'Content-Type: application/json' -d '{\"model\":%q,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n", base, authHeader, d.Model)
	fmt.Fprintf(out, "    curl %s/v1/responses%s -H 'Content-Type: application/json' -d '{\"model\":%q,\"input\":\"Hello!\"}'\n", base, authHeader, d.Model)
	fmt.Fprintf(out, "    curl %s/v1/messages%s -H 'Content-Type: application/json' -d '{\"model\":%q,\"max_tokens\":64,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n", base, authHeader, d.Model)
	fmt.Fprintf(out, "    curl %s/v1/models%s\n", base, authHeader)
	if d.APIKey == "" {
		fmt.Fprintf(out, "  dashboard: %s/ui   metrics: %s/metrics   status: iop status --edge %s\n", base, base, base)
	} else {
		// The one key of iop dev opens the admin routes too: a browser
		// asks for it as the password.
		fmt.Fprintf(out, "  dashboard: %s/ui (password: the key)   metrics: %s/metrics   status: iop status --edge %s --api-key %s\n", base, base, base, d.APIKey)
	}
	if len(d.Models) > 1 {
		fmt.Fprintf(out, "  %q is each of %v: a request goes to one that can take it (tools, thinking, embeddings...), the least loaded first; name one to pick it.\n", d.Model, d.Models)
	}
	fmt.Fprintln(out)
}

// Open checks the configuration, looks for a local Ollama and opens the
// steps: the in-process node's tracing, the simulators (if used), the
// edge (coreSteps) with the in-process node opened after its node
// endpoint, the wait for that node to connect, and the reload watch; then
// it prints the banner. ctx is the run context. Errors: an invalid
// configuration, a step that failed, a node that does not connect within
// 30s; the steps opened before are closed again.
func (d *devProcess) Open(ctx context.Context) error {
	cfg := d.cfg
	if cfg.SimCapacity < 1 {
		return fmt.Errorf("--sim-capacity %d: must be at least 1", cfg.SimCapacity)
	}
	if cfg.MaxBodyBytes < 0 || cfg.WriteTimeout < 0 {
		return fmt.Errorf("--max-body-bytes %d and --write-timeout %s must not be negative", cfg.MaxBodyBytes, cfg.WriteTimeout)
	}
	edgeCfg := DefaultEdgeFile()
	edgeCfg.Listen, edgeCfg.NodeListen = cfg.Listen, cfg.NodeListen
	edgeCfg.MaxBodyBytes, edgeCfg.WriteTimeout = cfg.MaxBodyBytes, cfg.WriteTimeout
	edgeCfg.DrainTimeout = cfg.DrainTimeout
	edgeCfg.Database = cfg.Database
	if edgeCfg.Database == "" {
		edgeCfg.Database = ":memory:"
	}
	edgeCfg.InsecureOpen = cfg.InsecureOpen
	if cfg.APIKey != "" {
		// The one key of iop dev also opens the admin API, the dashboard
		// (a browser gives it as the password of its login prompt) and
		// iop status.
		edgeCfg.Keys = []auth.Key{{Name: "dev", Hash: auth.Hash(cfg.APIKey)}}
		edgeCfg.AdminKeys = []auth.Key{{Name: "dev", Hash: auth.Hash(cfg.APIKey)}}
		d.APIKey = cfg.APIKey
	}
	list := []step{{name: "node tracing", open: d.openNodeTracing, close: d.closeNodeTracing}}
	var ollamaModels []string
	ollama := node.ProviderConfig{ID: "ollama", Type: node.TypeOllama, BaseURL: cfg.OllamaURL, Capacity: 1}
	if !cfg.ForceSim && cfg.OllamaURL != "" {
		ollamaModels = probeOllama(ctx, ollama)
	}
	if len(ollamaModels) > 0 {
		// No models: the node discovers them, with their capabilities, and
		// follows the ones pulled or removed while it runs (the alias keeps
		// the ones found now).
		d.providers = append(d.providers, ollama)
		edgeCfg.Models = map[string]edge.ModelConfig{devAlias: {Targets: ollamaModels}}
		d.Models = ollamaModels
		d.Model, d.Summary = devAlias, fmt.Sprintf("local Ollama at %s (%d models, behind alias %q)", cfg.OllamaURL, len(ollamaModels), devAlias)
	} else {
		if !cfg.ForceSim && cfg.OllamaURL != "" {
			d.logger.Info("no Ollama with models answers here: serving the built-in simulator", "ollama_url", cfg.OllamaURL)
		}
		for _, p := range []devSim{
			{"sim-ollama", devOllamaModel, sim.ProtocolOllama, ""},
			{"sim-openai", devOpenAIModel, sim.ProtocolOpenAI, "/v1"},
		} {
			var stop func()
			list = append(list, step{name: "sim " + p.id,
				open:  func(context.Context) (err error) { stop, err = d.startSim(p); return err },
				close: func(context.Context) error { stop(); return nil }})
			d.Models = append(d.Models, p.model)
		}
		edgeCfg.Models = map[string]edge.ModelConfig{devAlias: {Targets: []string{devOllamaModel, devOpenAIModel}}}
		d.Model, d.Summary = devAlias, fmt.Sprintf("simulator (alias %q → %s [normalized path], %s [tunnel path])", devAlias, devOllamaModel, devOpenAIModel)
	}
	d.Edge = &edgeProcess{cfg: edgeCfg, logger: d.logger}
	list = append(list, d.Edge.coreSteps(step{name: "in-process node", open: d.startAgent, close: d.drainAgent})...)
	list = append(list,
		step{name: "node ready", open: d.awaitAgent},
		step{name: "reload watcher", open: d.openWatch, close: d.closeWatch},
	)
	if err := d.steps.open(ctx, list); err != nil {
		return err
	}
	if d.stdout != nil {
		printBanner(d.stdout, d)
	}
	return nil
}

// Shutdown closes what Open opened, in reverse: the reload watch; the
// edge's drain (coreSteps), in which the in-process node drains as `iop
// node` does (it tells the edge, and the runs still going, background
// ones the edge is ending, may finish up to its drain timeout) after the
// edge's requests ended and before its node endpoint stops; then the
// simulators and the node's tracing. ctx ending cuts the edge's waits
// short and aborts the node's runs instead of draining them.
func (d *devProcess) Shutdown(ctx context.Context) error { return d.steps.close(ctx) }

func (d *devProcess) export(p *Process) {
	p.HTTPAddr, p.NodeAddr, p.Service, p.Ledger, p.NodeLink = d.Edge.HTTPAddr, d.Edge.NodeAddr, d.Edge.Service, d.Edge.Ledger, d.Edge.Link
	p.Agent, p.Dev = d.Agent, &d.DevInfo
}

// until blocks until ctx ends or one of the edge's servers fails.
func (d *devProcess) until(ctx context.Context) error { return d.Edge.until(ctx) }

// devSim is one simulated provider of iop dev.
type devSim struct {
	id, model string
	protocol  sim.Protocol
	path      string
}

// startSim starts the simulator of p, adds it to the in-process node's
// providers and returns its stop.
func (d *devProcess) startSim(p devSim) (stop func(), err error) {
	cfg := d.cfg
	s, err := sim.New(sim.Config{
		Protocol:               p.protocol,
		Models:                 []string{p.model},
		TTFT:                   cfg.SimTTFT,
		TokensPerSecond:        cfg.SimTokensPerSecond,
		MaxConcurrent:          cfg.SimCapacity,
		DefaultMaxTokens:       cfg.SimMaxTokens,
		Thinking:               cfg.SimThinking,
		PrefixCacheTokens:      cfg.SimPrefixCacheTokens,
		PrefillTokensPerSecond: cfg.SimPrefillTokensPerSecond,
	}, d.logger.With("provider", p.id))
	if err != nil {
		return nil, err
	}
	url, stop, err := s.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d.Sims = append(d.Sims, s)
	// The simulator takes tools and images, answers embedding requests
	// and can call tools, so a client can be tried against iop dev.
	d.providers = append(d.providers, node.ProviderConfig{
		ID: p.id, Type: node.TypeSim, Protocol: string(p.protocol), BaseURL: url + p.path,
		Models: []string{p.model}, Capacity: cfg.SimCapacity, Capabilities: []string{"tools", "vision", "embeddings"},
	})
	return stop, nil
}

// openNodeTracing starts the in-process node's tracing: as a node's, by
// the environment.
func (d *devProcess) openNodeTracing(ctx context.Context) (err error) {
	d.ntr, err = tracing.Start(ctx, tracing.Config{}, nil, "iop-node", d.logger)
	return err
}

// closeNodeTracing exports the in-process node's last spans.
func (d *devProcess) closeNodeTracing(context.Context) error {
	shutdownTracing(d.ntr, d.logger)
	return nil
}

// startAgent makes the in-process node and runs it; it connects to the
// edge through its in-memory link (edgeProcess.Link). The node outlives
// the run context until its step is closed.
func (d *devProcess) startAgent(context.Context) error {
	d.nodeCfg = node.Config{
		NodeID:            "dev",
		Label:             "iop dev in-process node",
		Version:           d.version,
		Providers:         d.providers,
		DiscoveryInterval: d.cfg.DiscoveryInterval,
	}
	d.local = &localNode{cfg: d.nodeCfg, opts: []node.Option{node.WithTracer(d.ntr.Tracer)}, logger: d.logger, reason: "iop dev stopping"}
	if err := d.local.start(d.Edge.Link); err != nil {
		return err
	}
	d.Agent = d.local.Agent
	return nil
}

// drainAgent drains the in-process node and waits for its Run
// (localNode.drain).
func (d *devProcess) drainAgent(ctx context.Context) error { return d.local.drain(ctx) }

// awaitAgent waits for the in-process node to connect (localNode.await).
func (d *devProcess) awaitAgent(ctx context.Context) error { return d.local.await(ctx) }

// openWatch reloads the configuration (reload) at each SIGHUP, until
// Shutdown.
func (d *devProcess) openWatch(context.Context) (err error) {
	d.stopWatch, err = watchConfig("", reloadFunc(d.load, d.reload, d.logger), d.logger, d.hangup)
	return err
}

func (d *devProcess) closeWatch(context.Context) error {
	d.stopWatch()
	return nil
}

// probeTimeout bounds the look for a local Ollama (its model list and what
// it says of each model).
const probeTimeout = 5 * time.Second

// probeOllama returns the models of the Ollama of pc (read as its node
// discovers them), those that generate text first (the alias's first
// target answers chat), each group by name; nil if none answers within
// probeTimeout.
func probeOllama(ctx context.Context, pc node.ProviderConfig) []string {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	models, err := node.Discover(ctx, pc)
	if err != nil {
		return nil
	}
	var text, other []string
	for _, m := range models {
		if m.Capabilities == nil || slices.Contains(m.Capabilities, "completion") {
			text = append(text, m.Name)
		} else {
			other = append(other, m.Name)
		}
	}
	return append(text, other...)
}

// DevDefaults is the configuration `iop dev` starts from: the HTTP API on
// 127.0.0.1:8080, the node endpoint on an ephemeral loopback port, a local
// Ollama looked for at http://127.0.0.1:11434, simulated providers of
// capacity 4 at 50 tokens/s with a 150 ms time to first token, the edge's
// HTTP limits, and run records in DefaultDatabase.
func DevDefaults() DevConfig {
	return DevConfig{
		Listen:             "127.0.0.1:8080",
		NodeListen:         "127.0.0.1:0",
		OllamaURL:          "http://127.0.0.1:11434",
		SimCapacity:        4,
		SimTokensPerSecond: 50,
		SimTTFT:            150 * time.Millisecond,
		MaxBodyBytes:       api.DefaultMaxBodyBytes,
		WriteTimeout:       api.DefaultWriteTimeout,
		Database:           DefaultDatabase,
	}
}
