package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"iop/internal/benchrun"
)

// batchFlags are the flags of `iop bench --batch`.
type batchFlags struct {
	on  bool
	cfg benchrun.BatchConfig
}

func (f *batchFlags) register(fl *pflag.FlagSet) {
	fl.BoolVar(&f.on, "batch", false, "run the batch-band benchmark (starts its own sims and node, the edge in this process): interactive load at --batch-load × the fleet's capacity, alone and beside a batch of --batch-lines lines uploaded with POST /v1/files and run by the edge's batch runner (POST /v1/batches), polled to its end and its output checked")
	fl.IntVar(&f.cfg.Lines, "batch-lines", 0, "with --batch: lines of the batch (default 10000); the batch always runs to its end, on the whole fleet after the window")
	fl.IntVar(&f.cfg.Providers, "batch-providers", 0, "with --batch: simulators, one provider each (default 2)")
	fl.IntVar(&f.cfg.Capacity, "batch-capacity", 0, "with --batch: each provider's capacity (default 8)")
	fl.DurationVar(&f.cfg.TTFT, "batch-ttft", 0, "with --batch: the simulators' time to first token (default 1s)")
	fl.Float64Var(&f.cfg.TokensPerSecond, "batch-tokens-per-second", 0, "with --batch: the simulators' token rate (default 20); interactive answers are 4 tokens")
	fl.IntVar(&f.cfg.BatchMaxTokens, "batch-max-tokens", 0, "with --batch: batch line i asks for 1 + i mod this many tokens (default 40)")
	fl.Float64Var(&f.cfg.Load, "batch-load", 0, "with --batch: the interactive rate, a fraction of the fleet's capacity (default 0.6)")
	fl.IntVar(&f.cfg.Headroom, "batch-headroom", 0, "with --batch: the edge's queue.batch.headroom (default 1; negative: none)")
	fl.DurationVar(&f.cfg.Backoff, "batch-backoff", 0, "with --batch: the edge's queue.batch.backoff (default 5s; negative: none)")
}

func runBatch(cmd *cobra.Command, f benchFlags) error {
	own, err := ownRunOf(cmd, f)
	if err != nil {
		return err
	}
	cfg := f.batch.cfg
	cfg.Binary, cfg.Log = own.binary, own.log
	if own.duration != 0 {
		cfg.Duration = own.duration
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	rep, err := benchrun.Batch(ctx, cfg)
	if err != nil {
		return err
	}
	return writeReport(cmd, f, rep, rep.WriteTable)
}
