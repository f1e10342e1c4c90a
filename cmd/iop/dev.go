package main

import (
	"github.com/spf13/cobra"

	"iop/internal/process"
)

func newDevCommand(logLevel *string) *cobra.Command {
	cfg := process.DevDefaults()
	var configPath string
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an edge with an in-process node (a local Ollama if one answers, else the simulator)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := setUp(cmd, *logLevel, configPath, &cfg)
			if err != nil {
				return err
			}
			pc := process.Config{Mode: process.ModeDev, Dev: cfg, Version: version}
			if configPath != "" {
				// SIGHUP reads the file again under the flags the user set.
				pc.ReloadDev = func() (process.DevConfig, error) {
					err := process.LoadConfig(cmd.Flags(), configPath, &cfg, func() { cfg = process.DevDefaults() })
					return cfg, err
				}
			}
			p, err := process.Start(cmd.Context(), pc, process.Deps{Logger: logger, Stdout: cmd.OutOrStdout(), Hangup: hangup()})
			if err != nil {
				return err
			}
			// Ctrl-C (or SIGTERM) drains; a second one stops at once.
			process.HandleSignals(p)
			return p.Wait()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configPath, "config", "", "YAML config file (flags override it)")
	fl.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API listen address")
	fl.StringVar(&cfg.NodeListen, "node-listen", cfg.NodeListen, "node endpoint (gRPC) listen address; remote nodes may join too")
	fl.BoolVar(&cfg.ForceSim, "sim", false, "use the built-in simulator even if a local Ollama answers")
	fl.StringVar(&cfg.OllamaURL, "ollama", cfg.OllamaURL, `base URL of the Ollama to use if it answers ("" = never look for one)`)
	fl.IntVar(&cfg.SimCapacity, "sim-capacity", cfg.SimCapacity, "capacity of each simulated provider")
	fl.Float64Var(&cfg.SimTokensPerSecond, "sim-tokens-per-second", cfg.SimTokensPerSecond, "token rate of the simulated providers (0 = unlimited)")
	fl.DurationVar(&cfg.SimTTFT, "sim-ttft", cfg.SimTTFT, "time to first token of the simulated providers")
	fl.IntVar(&cfg.SimMaxTokens, "sim-max-tokens", cfg.SimMaxTokens, "longest simulated answer, in tokens (0 = 16)")
	fl.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on Ctrl-C: how long requests in flight may take before they are ended (a second Ctrl-C stops at once; 0 = 30s)")
	fl.BoolVar(&cfg.SimThinking, "sim-thinking", cfg.SimThinking, "the simulated models think before they answer (Ollama's message.thinking, OpenAI's reasoning_content)")
	fl.IntVar(&cfg.SimPrefixCacheTokens, "sim-prefix-cache-tokens", 0, "prefix cache of each simulated provider, in tokens (0 = none; see iop sim --prefix-cache-tokens)")
	fl.Float64Var(&cfg.SimPrefillTokensPerSecond, "sim-prefill-tokens-per-second", 0, "prefill rate of the simulated providers: uncached prompt tokens add to the time to first token (0 = free)")
	addHTTPFlags(fl, &cfg.MaxBodyBytes, &cfg.WriteTimeout)
	fl.StringVar(&cfg.Database, "database", cfg.Database, `SQLite file of run records and the usage ledger (":memory:" = not kept)`)
	fl.StringVar(&cfg.APIKey, "api-key", "", "require this client API key (Authorization: Bearer KEY or x-api-key)")
	fl.BoolVar(&cfg.InsecureOpen, "insecure-open", false, "serve the client API without a key on a non-loopback address")
	return cmd
}
