package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"iop/internal/benchrun"
)

// fairFlags are the flags of `iop bench --fair`.
type fairFlags struct {
	on  bool
	cfg benchrun.FairConfig
}

func (f *fairFlags) register(fl *pflag.FlagSet) {
	fl.BoolVar(&f.on, "fair", false, "run the fair-sharing benchmark (starts its own sim, edge and node): a flood key at --fair-flood × capacity beside a light key at --fair-light ×, alone, with fairness on and with fairness: off")
	fl.IntVar(&f.cfg.Capacity, "fair-capacity", 2, "with --fair: the provider's capacity")
	fl.DurationVar(&f.cfg.TTFT, "fair-service", 0, "with --fair: the simulator's time to first token, which is the service time (default 100ms)")
	fl.Float64Var(&f.cfg.Flood, "fair-flood", 10, "with --fair: the flood key's rate, a multiple of capacity")
	fl.Float64Var(&f.cfg.Light, "fair-light", 0.1, "with --fair: the light key's rate, a fraction of capacity")
}

func runFair(cmd *cobra.Command, f benchFlags) error {
	own, err := ownRunOf(cmd, f)
	if err != nil {
		return err
	}
	cfg := f.fair.cfg
	cfg.Binary, cfg.Log = own.binary, own.log
	if own.duration != 0 {
		cfg.Duration = own.duration
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	rep, err := benchrun.Fair(ctx, cfg)
	if err != nil {
		return err
	}
	return writeReport(cmd, f, rep, rep.WriteTable)
}
