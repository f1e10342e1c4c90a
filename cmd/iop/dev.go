package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
)

// devConfig configures `iop dev`: an edge and an in-process node in one
// process, reaching each other over the same gRPC path a remote node uses.
type devConfig struct {
	Listen     string // HTTP API address
	NodeListen string // node endpoint address; default an ephemeral loopback port
	ForceSim   bool   // use the simulator even if a local Ollama answers
	OllamaURL  string // where to look for a local Ollama; "" = never
	// The simulated providers: capacity each, token rate (tokens/s) and
	// time to first token.
	SimCapacity        int
	SimTokensPerSecond float64
	SimTTFT            time.Duration
}

// Names used by the simulated providers of `iop dev`.
const (
	devAlias       = "demo"
	devOllamaModel = "sim-ollama"
	devOpenAIModel = "sim-openai"
)

func newDevCommand(logLevel *string) *cobra.Command {
	cfg := devConfig{
		Listen:             "127.0.0.1:8080",
		NodeListen:         "127.0.0.1:0",
		OllamaURL:          "http://127.0.0.1:11434",
		SimCapacity:        4,
		SimTokensPerSecond: 50,
		SimTTFT:            150 * time.Millisecond,
	}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an edge with an in-process node (a local Ollama if one answers, else the simulator)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(*logLevel)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			d, err := startDev(ctx, cfg, logger)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "\niop dev is ready: %s\n", d.Summary)
			fmt.Fprintf(out, "  OpenAI-compatible API: http://%s/v1\n", d.Edge.HTTPAddr)
			fmt.Fprintf(out, "  try:\n    curl -N http://%s/v1/chat/completions -H 'Content-Type: application/json' -d '{\"model\":%q,\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n\n", d.Edge.HTTPAddr, d.Model)
			return d.Wait()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API listen address")
	fl.StringVar(&cfg.NodeListen, "node-listen", cfg.NodeListen, "node endpoint (gRPC) listen address; remote nodes may join too")
	fl.BoolVar(&cfg.ForceSim, "sim", false, "use the built-in simulator even if a local Ollama answers")
	fl.IntVar(&cfg.SimCapacity, "sim-capacity", cfg.SimCapacity, "capacity of each simulated provider")
	fl.Float64Var(&cfg.SimTokensPerSecond, "sim-tokens-per-second", cfg.SimTokensPerSecond, "token rate of the simulated providers (0 = unlimited)")
	fl.DurationVar(&cfg.SimTTFT, "sim-ttft", cfg.SimTTFT, "time to first token of the simulated providers")
	return cmd
}

// devStack is a running `iop dev`.
type devStack struct {
	Edge    *edgeProcess
	Agent   *node.Agent
	Sims    []*sim.Server // the simulated providers, if used
	Model   string        // the model name to try
	Summary string        // what serves it, for people
	done    chan error
}

// startDev starts the edge, the simulated providers (unless a local Ollama
// answers and ForceSim is off) and the in-process node, and returns once the
// node is connected.
func startDev(ctx context.Context, cfg devConfig, logger *slog.Logger) (*devStack, error) {
	if cfg.SimCapacity < 1 {
		return nil, fmt.Errorf("--sim-capacity %d: must be at least 1", cfg.SimCapacity)
	}
	ctx, cancel := context.WithCancel(ctx)
	d := &devStack{done: make(chan error, 1)}
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
	if !cfg.ForceSim && cfg.OllamaURL != "" {
		ollamaModels = probeOllama(ctx, cfg.OllamaURL)
	}
	edgeCfg := edge.DefaultConfig()
	edgeCfg.Listen, edgeCfg.NodeListen = cfg.Listen, cfg.NodeListen
	if len(ollamaModels) > 0 {
		providers = append(providers, node.ProviderConfig{ID: "ollama", Type: node.TypeOllama, BaseURL: cfg.OllamaURL, Models: ollamaModels, Capacity: 1})
		edgeCfg.Models = map[string]edge.ModelConfig{devAlias: {Targets: ollamaModels}}
		d.Model, d.Summary = devAlias, fmt.Sprintf("local Ollama at %s (%d models; alias %q → %s)", cfg.OllamaURL, len(ollamaModels), devAlias, ollamaModels[0])
	} else {
		for _, p := range []struct {
			id, model string
			protocol  sim.Protocol
			path      string
		}{
			{"sim-ollama", devOllamaModel, sim.ProtocolOllama, ""},
			{"sim-openai", devOpenAIModel, sim.ProtocolOpenAI, "/v1"},
		} {
			s, err := sim.New(sim.Config{
				Protocol:        p.protocol,
				Models:          []string{p.model},
				TTFT:            cfg.SimTTFT,
				TokensPerSecond: cfg.SimTokensPerSecond,
				MaxConcurrent:   cfg.SimCapacity,
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
			providers = append(providers, node.ProviderConfig{
				ID: p.id, Type: node.TypeSim, Protocol: string(p.protocol), BaseURL: url + p.path,
				Models: []string{p.model}, Capacity: cfg.SimCapacity,
			})
		}
		edgeCfg.Models = map[string]edge.ModelConfig{devAlias: {Targets: []string{devOllamaModel, devOpenAIModel}}}
		d.Model, d.Summary = devAlias, fmt.Sprintf("simulator (alias %q → %s [normalized path], %s [tunnel path])", devAlias, devOllamaModel, devOpenAIModel)
	}

	e, err := startEdge(ctx, edgeCfg, logger)
	if err != nil {
		return fail(err)
	}
	d.Edge = e
	agent, err := node.New(node.Config{
		NodeID:    "dev",
		Label:     "iop dev in-process node",
		Edge:      e.NodeAddr,
		Providers: providers,
	}, logger)
	if err != nil {
		cancel()
		e.Wait()
		return fail(err)
	}
	d.Agent = agent
	agentDone := make(chan error, 1)
	go func() { agentDone <- agent.Run(ctx) }()
	select {
	case <-agent.Ready():
	case err := <-agentDone:
		cancel()
		e.Wait()
		return fail(fmt.Errorf("in-process node stopped: %w", err))
	case <-time.After(30 * time.Second):
		cancel()
		e.Wait()
		<-agentDone
		return fail(errors.New("in-process node did not connect within 30s"))
	}
	go func() {
		<-ctx.Done()
		cancel()
		aerr := <-agentDone
		eerr := e.Wait()
		for _, stop := range stops {
			stop()
		}
		d.done <- errors.Join(eerr, aerr)
	}()
	return d, nil
}

// Wait blocks until the stack has stopped.
func (d *devStack) Wait() error { return <-d.done }

// probeOllama returns the models of the Ollama at baseURL, or nil if none
// answers within a second.
func probeOllama(ctx context.Context, baseURL string) []string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, baseURL+"/api/tags", nil)
	if err != nil {
		return nil
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var tags struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	if json.NewDecoder(resp.Body).Decode(&tags) != nil {
		return nil
	}
	var names []string
	for _, m := range tags.Models {
		if m.Name != "" {
			names = append(names, m.Name)
		}
	}
	return names
}
