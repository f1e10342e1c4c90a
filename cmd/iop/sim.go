package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/sim"
)

// simFile is the YAML shape of `iop sim --config`.
type simFile struct {
	Protocol         string        `yaml:"protocol"`
	Listen           string        `yaml:"listen"`
	Models           []string      `yaml:"models"`
	TTFT             time.Duration `yaml:"ttft"`
	TokensPerSecond  float64       `yaml:"tokens_per_second"`
	MaxConcurrent    int           `yaml:"max_concurrent"`
	Seed             int64         `yaml:"seed"`
	DefaultMaxTokens int           `yaml:"default_max_tokens"`
	APIKey           string        `yaml:"api_key"`
	Thinking         bool          `yaml:"thinking"`
	ReasoningField   string        `yaml:"reasoning_field"`
	// PrefixCacheTokens and PrefillTokensPerSecond: sim.Config's.
	PrefixCacheTokens      int     `yaml:"prefix_cache_tokens"`
	PrefillTokensPerSecond float64 `yaml:"prefill_tokens_per_second"`
	CountRepeats           bool    `yaml:"count_repeats"`
	// MaxLoadedModels, LoadTime and LoadTimes (per model): sim.Config's.
	MaxLoadedModels int                      `yaml:"max_loaded_models"`
	LoadTime        time.Duration            `yaml:"load_time"`
	LoadTimes       map[string]time.Duration `yaml:"load_times"`
	Faults          struct {
		ErrorRate   float64 `yaml:"error_rate"`
		ErrorStatus int     `yaml:"error_status"`
		DropAfter   int     `yaml:"drop_after"`
		StreamError int     `yaml:"stream_error_after"`
		Hang        bool    `yaml:"hang"`
	} `yaml:"faults"`
}

func newSimCommand(logLevel *string) *cobra.Command {
	var configPath string
	f := simFile{Protocol: "openai", Listen: "127.0.0.1:9000"}
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run a model server simulator speaking the Ollama or OpenAI wire protocol",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := setUp(cmd, *logLevel, configPath, &f)
			if err != nil {
				return err
			}
			s, err := sim.New(sim.Config{
				Protocol:               sim.Protocol(f.Protocol),
				Models:                 f.Models,
				TTFT:                   f.TTFT,
				TokensPerSecond:        f.TokensPerSecond,
				MaxConcurrent:          f.MaxConcurrent,
				Seed:                   f.Seed,
				DefaultMaxTokens:       f.DefaultMaxTokens,
				APIKey:                 f.APIKey,
				Thinking:               f.Thinking,
				ReasoningField:         f.ReasoningField,
				PrefixCacheTokens:      f.PrefixCacheTokens,
				PrefillTokensPerSecond: f.PrefillTokensPerSecond,
				CountRepeats:           f.CountRepeats,
				MaxLoadedModels:        f.MaxLoadedModels,
				LoadTime:               f.LoadTime,
				LoadTimes:              f.LoadTimes,
				Faults: sim.Faults{
					ErrorRate:        f.Faults.ErrorRate,
					ErrorStatus:      f.Faults.ErrorStatus,
					DropAfter:        f.Faults.DropAfter,
					StreamErrorAfter: f.Faults.StreamError,
					Hang:             f.Faults.Hang,
				},
			}, logger)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			hup := hangup()
			go func() {
				for {
					select {
					case <-hup:
						logger.Info("SIGHUP: iop sim reads no config again; restart it to change its settings", "component", "config")
					case <-ctx.Done():
						return
					}
				}
			}()
			fmt.Fprintf(cmd.OutOrStdout(), "iop sim (%s) listening on http://%s\n", f.Protocol, f.Listen)
			return s.ListenAndServe(ctx, f.Listen)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configPath, "config", "", "YAML config file (flags override it)")
	fl.StringVar(&f.Protocol, "protocol", f.Protocol, "wire protocol: ollama or openai")
	fl.StringVar(&f.Listen, "listen", f.Listen, "HTTP listen address")
	fl.StringSliceVar(&f.Models, "model", nil, "served model name (repeatable; default sim-model)")
	fl.DurationVar(&f.TTFT, "ttft", 0, "time to first token")
	fl.Float64Var(&f.TokensPerSecond, "tokens-per-second", 0, "token rate after the first (0 = unlimited)")
	fl.IntVar(&f.MaxConcurrent, "max-concurrent", 0, "max concurrent requests, over it 429 (0 = unlimited)")
	fl.Int64Var(&f.Seed, "seed", 0, "seed of the deterministic output")
	fl.IntVar(&f.DefaultMaxTokens, "default-max-tokens", 0, "tokens per answer (default 16); a request's max_tokens can only lower it")
	fl.StringVar(&f.APIKey, "api-key", "", "require this bearer token")
	fl.BoolVar(&f.Thinking, "thinking", false, "serve thinking models: answers start with reasoning (Ollama: message.thinking, or thinking in /api/generate, unless think is false; OpenAI: see --reasoning-field, unless reasoning_effort is none)")
	fl.StringVar(&f.ReasoningField, "reasoning-field", "", `the OpenAI answer's reasoning field: reasoning_content (default) or reasoning`)
	fl.IntVar(&f.PrefixCacheTokens, "prefix-cache-tokens", 0, "keep an LRU prefix cache of this many prompt tokens (blocks of 16 words, chained hashes); hits and misses in GET /stats")
	fl.Float64Var(&f.PrefillTokensPerSecond, "prefill-tokens-per-second", 0, "add uncached prompt tokens / this rate to the time to first token (0 = prefill is free)")
	fl.BoolVar(&f.CountRepeats, "count-repeats", false, "count admitted requests whose prompt an earlier one had (repeated in GET /stats; admitted counts them all)")
	fl.IntVar(&f.MaxLoadedModels, "max-loaded-models", 0, "hold at most this many models loaded (LRU eviction of an idle one; 0 = no limit); with it or --load-time models start unloaded, load on demand and /api/ps lists the loaded ones; loads and evictions in GET /stats")
	fl.DurationVar(&f.LoadTime, "load-time", 0, "how long loading a model takes (per model: load_times in --config); reported as load_duration in Ollama answers")
	fl.Float64Var(&f.Faults.ErrorRate, "error-rate", 0, "fraction of requests answered with --error-status")
	fl.IntVar(&f.Faults.ErrorStatus, "error-status", 0, "status of injected errors (default 500)")
	fl.IntVar(&f.Faults.DropAfter, "drop-after", 0, "drop the connection after this many streamed tokens")
	fl.IntVar(&f.Faults.StreamError, "stream-error-after", 0, "report an error inside the stream after this many streamed tokens")
	fl.BoolVar(&f.Faults.Hang, "hang", false, "accept requests and never answer")
	return cmd
}
