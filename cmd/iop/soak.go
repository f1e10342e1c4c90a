package main

import (
	"errors"
	"time"

	"github.com/spf13/cobra"

	"iop/internal/process"
)

func newSoakCommand(logLevel *string) *cobra.Command {
	cfg := process.SoakConfig{Clients: 1000, Capacity: 8, MaxQueue: 16, QueueTimeout: time.Second,
		Duration: 30 * time.Second, TokensPerSecond: 200, MaxTokens: 16}
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Run a request storm against an in-process edge, node and simulator and check that nothing leaks",
		Long: `Start an edge, a node and a model server simulator in this process, with one
provider of --capacity slots and a model of --max-queue and --queue-timeout,
then let --clients clients send chat requests, each one after the other, for
--duration. Print the requests, their outcomes by status, the slots still
held or queued afterwards (must be 0: it exits 1 otherwise) and the
goroutines before and after.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The storm's 429s and 503s would flood the log: errors only,
			// unless --log-level says otherwise.
			level := "error"
			if fl := cmd.Flag("log-level"); fl != nil && fl.Changed {
				level = *logLevel
			}
			format, _ := cmd.Flags().GetString("log-format")
			logger, err := process.NewLogger(cmd.ErrOrStderr(), level, format)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			res, err := process.Soak(ctx, cfg, logger)
			if err != nil {
				return err
			}
			res.Write(cmd.OutOrStdout())
			if res.Leaked() {
				return errors.New("slots leaked")
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.IntVarP(&cfg.Clients, "clients", "c", cfg.Clients, "concurrent clients")
	fl.IntVar(&cfg.Capacity, "capacity", cfg.Capacity, "the provider's capacity (concurrent requests)")
	fl.IntVar(&cfg.MaxQueue, "max-queue", cfg.MaxQueue, "the model's max queued requests; one more gets 429")
	fl.DurationVar(&cfg.QueueTimeout, "queue-timeout", cfg.QueueTimeout, "the model's max wait for a slot; then 503")
	fl.DurationVarP(&cfg.Duration, "duration", "d", cfg.Duration, "how long clients send requests")
	fl.Float64Var(&cfg.TokensPerSecond, "tokens-per-second", cfg.TokensPerSecond, "the simulator's token rate")
	fl.IntVar(&cfg.MaxTokens, "max-tokens", cfg.MaxTokens, "tokens per answer")
	fl.BoolVar(&cfg.Stream, "stream", false, "ask for streamed answers")
	return cmd
}
