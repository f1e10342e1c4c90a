package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"iop/internal/benchrun"
)

// residencyFlags are the flags of `iop bench --residency`.
type residencyFlags struct {
	on  bool
	cfg benchrun.ResidencyConfig
}

func (f *residencyFlags) register(fl *pflag.FlagSet) {
	fl.BoolVar(&f.on, "residency", false, "run the model-residency benchmark (starts its own sims, edge and node): clients alternating between models over simulated Ollamas that hold few models, residency-aware vs least-loaded routing on the same trace")
	fl.IntVar(&f.cfg.Models, "residency-models", 0, "with --residency: models (default 3)")
	fl.IntVar(&f.cfg.Providers, "residency-providers", 0, "with --residency: simulated Ollama providers (default 2)")
	fl.IntVar(&f.cfg.MaxLoaded, "residency-max-loaded", 0, "with --residency: models each provider holds at once (default 1)")
	fl.IntVar(&f.cfg.Capacity, "residency-capacity", 0, "with --residency: concurrent requests per provider (default 2)")
	fl.DurationVar(&f.cfg.LoadTime, "residency-load-time", 0, "with --residency: a model load (default 2s)")
	fl.DurationVar(&f.cfg.Service, "residency-service", 0, "with --residency: a request's time on a loaded model (default 250ms)")
	fl.Float64Var(&f.cfg.Rate, "residency-rate", 0, "with --residency: arrivals per second (default 2)")
	fl.DurationVar(&f.cfg.MaxExtraWait, "residency-max-extra-wait", 0, "with --residency: the edge's residency.max_extra_wait (default 10s)")
	fl.DurationVar(&f.cfg.Warmup, "residency-warmup", 0, "with --residency: the start of the trace left out of the steady-state latency (default 10s)")
	fl.Uint64Var(&f.cfg.Seed, "residency-seed", 0, "with --residency: the trace's seed (default 1)")
}

func runResidency(cmd *cobra.Command, f benchFlags) error {
	own, err := ownRunOf(cmd, f)
	if err != nil {
		return err
	}
	cfg := f.residency.cfg
	cfg.Binary, cfg.Log = own.binary, own.log
	if own.duration != 0 {
		cfg.Duration = own.duration
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	rep, err := benchrun.Residency(ctx, cfg)
	if err != nil {
		return err
	}
	return writeReport(cmd, f, rep, rep.WriteTable)
}
