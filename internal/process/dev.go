package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"iop/internal/auth"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/tracing"
)

// DevConfig configures ModeDev (`iop dev`): an edge and an in-process node
// in one process, reaching each other over the same gRPC path a remote node
// uses. Its YAML shape (`iop dev --config`) uses the field names below.
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

// devStack is a running `iop dev`.
type devStack struct {
	DevInfo
	Edge  *edgeRun
	Agent *node.Agent
	done  chan error

	logger  *slog.Logger
	mu      sync.Mutex  // serializes reload; guards the fields below
	cfg     DevConfig   // as running
	nodeCfg node.Config // the in-process node's, as running
}

// reload applies next, iop dev's configuration read again: its api_key
// (the client and admin key, at once) and discovery_interval (the
// in-process node's); every other changed setting is logged as applying
// at the next start. A next that is refused changes nothing.
func (d *devStack) reload(next DevConfig, trigger string) error {
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
func printBanner(out io.Writer, d *devStack) {
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

// startDev starts the edge, the simulated providers (unless a local Ollama
// answers and ForceSim is off) and the in-process node (reporting version),
// and returns once the node is connected. When ctx ends the edge drains
// (startEdge), then the node drains; when abort ends the edge's waits are
// cut short (startEdge) and the node's runs are aborted instead of drained.
func startDev(ctx, abort context.Context, cfg DevConfig, version string, logger *slog.Logger) (*devStack, error) {
	if cfg.SimCapacity < 1 {
		return nil, fmt.Errorf("--sim-capacity %d: must be at least 1", cfg.SimCapacity)
	}
	if cfg.MaxBodyBytes < 0 || cfg.WriteTimeout < 0 {
		return nil, fmt.Errorf("--max-body-bytes %d and --write-timeout %s must not be negative", cfg.MaxBodyBytes, cfg.WriteTimeout)
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &devStack{done: make(chan error, 1), logger: logger, cfg: cfg}
	var stops []func()
	fail := func(err error) (*devStack, error) {
		cancel()
		for _, stop := range stops {
			stop()
		}
		return nil, err
	}

	var providers []node.ProviderConfig
	var ollamaModels []string
	ollama := node.ProviderConfig{ID: "ollama", Type: node.TypeOllama, BaseURL: cfg.OllamaURL, Capacity: 1}
	if !cfg.ForceSim && cfg.OllamaURL != "" {
		ollamaModels = probeOllama(ctx, ollama)
	}
	edgeCfg := edge.DefaultConfig()
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
	if len(ollamaModels) > 0 {
		// No models: the node discovers them, with their capabilities, and
		// follows the ones pulled or removed while it runs (the alias keeps
		// the ones found now).
		providers = append(providers, ollama)
		edgeCfg.Models = map[string]edge.ModelConfig{devAlias: {Targets: ollamaModels}}
		d.Models = ollamaModels
		d.Model, d.Summary = devAlias, fmt.Sprintf("local Ollama at %s (%d models, behind alias %q)", cfg.OllamaURL, len(ollamaModels), devAlias)
	} else {
		if !cfg.ForceSim && cfg.OllamaURL != "" {
			logger.Info("no Ollama with models answers here: serving the built-in simulator", "ollama_url", cfg.OllamaURL)
		}
		for _, p := range []struct {
			id, model string
			protocol  sim.Protocol
			path      string
		}{
			{"sim-ollama", devOllamaModel, sim.ProtocolOllama, ""},
			{"sim-openai", devOpenAIModel, sim.ProtocolOpenAI, "/v1"},
		} {
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
			}, logger.With("provider", p.id))
			if err != nil {
				return fail(err)
			}
			url, stop, err := s.Start("127.0.0.1:0")
			if err != nil {
				return fail(err)
			}
			stops = append(stops, stop)
			d.Sims = append(d.Sims, s)
			// The simulator takes tools and images, answers embedding requests
			// and can call tools, so a client can be tried against iop dev.
			providers = append(providers, node.ProviderConfig{
				ID: p.id, Type: node.TypeSim, Protocol: string(p.protocol), BaseURL: url + p.path,
				Models: []string{p.model}, Capacity: cfg.SimCapacity, Capabilities: []string{"tools", "vision", "embeddings"},
			})
			d.Models = append(d.Models, p.model)
		}
		edgeCfg.Models = map[string]edge.ModelConfig{devAlias: {Targets: []string{devOllamaModel, devOpenAIModel}}}
		d.Model, d.Summary = devAlias, fmt.Sprintf("simulator (alias %q → %s [normalized path], %s [tunnel path])", devAlias, devOllamaModel, devOpenAIModel)
	}

	// The in-process node outlives ctx until the edge has drained its
	// requests (they need it), then drains as `iop node` does (it tells
	// the edge, and the runs still going, background ones the edge is
	// ending, may finish up to its drain timeout) before the edge's node
	// endpoint stops.
	agentCtx, stopAgent := context.WithCancel(context.Background())
	agentDone := make(chan error, 1)
	agentStarted := make(chan struct{})
	var agent *node.Agent // set before agentStarted is closed
	var agentErr error    // set by afterDrain, read after the edge stopped
	afterDrain := func() {
		defer stopAgent()
		select {
		case <-agentStarted:
			agent.Drain("iop dev stopping")
			select {
			case agentErr = <-agentDone:
			case <-abort.Done():
				stopAgent()
				agentErr = <-agentDone
			}
		default:
		}
	}
	e, err := startEdge(ctx, abort, edgeCfg, logger, afterDrain)
	if err != nil {
		stopAgent()
		return fail(err)
	}
	d.Edge = e
	stopEdge := func() { cancel(); e.Wait() }
	// The in-process node traces as a node would, by the environment.
	ntr, err := tracing.Start(ctx, tracing.Config{}, nil, "iop-node", logger)
	if err != nil {
		stopEdge()
		return fail(err)
	}
	stops = append(stops, func() { shutdownTracing(ntr, logger) })
	d.nodeCfg = node.Config{
		NodeID:            "dev",
		Label:             "iop dev in-process node",
		Version:           version,
		Edge:              e.NodeAddr,
		Providers:         providers,
		DiscoveryInterval: cfg.DiscoveryInterval,
	}
	agent, err = node.New(d.nodeCfg, logger, node.WithTracer(ntr.Tracer))
	if err != nil {
		stopEdge()
		return fail(err)
	}
	d.Agent = agent
	close(agentStarted)
	go func() { agentDone <- agent.Run(agentCtx) }()
	select {
	case <-agent.Ready():
	case err := <-agentDone:
		agentDone <- err // for afterDrain
		stopEdge()
		return fail(fmt.Errorf("in-process node stopped: %w", err))
	case <-time.After(30 * time.Second):
		stopEdge()
		return fail(errors.New("in-process node did not connect within 30s"))
	}
	go func() {
		<-ctx.Done()
		cancel()
		eerr := e.Wait()
		for _, stop := range stops {
			stop()
		}
		d.done <- errors.Join(eerr, agentErr)
	}()
	return d, nil
}

// Wait blocks until the stack has stopped.
func (d *devStack) Wait() error { return <-d.done }

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
// HTTP limits, and run records in edge.DefaultDatabase.
func DevDefaults() DevConfig {
	return DevConfig{
		Listen:             "127.0.0.1:8080",
		NodeListen:         "127.0.0.1:0",
		OllamaURL:          "http://127.0.0.1:11434",
		SimCapacity:        4,
		SimTokensPerSecond: 50,
		SimTTFT:            150 * time.Millisecond,
		MaxBodyBytes:       edge.DefaultMaxBodyBytes,
		WriteTimeout:       edge.DefaultWriteTimeout,
		Database:           edge.DefaultDatabase,
	}
}
