package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"iop/internal/benchrun"
)

// peersFlags are the flags of `iop bench --peers`.
type peersFlags struct {
	on  bool
	cfg benchrun.PeersConfig
}

func (f *peersFlags) register(fl *pflag.FlagSet) {
	fl.BoolVar(&f.on, "peers", false, "run the side-by-side benchmark (make bench-peers; Linux): iop (edge + node, tunnel and normalized paths; an edge serving the provider itself, its node in its process), Olla and Bifrost in front of one mock model server, the peer table's workloads (BENCHMARKS.md) in alternating rounds")
	fl.StringVar(&f.cfg.Olla, "olla", "", "with --peers: Olla's executable (none: Olla is left out)")
	fl.StringVar(&f.cfg.OllaDir, "olla-dir", "", "with --peers: Olla's working directory, the root of its source tree (default: the executable's directory)")
	fl.StringVar(&f.cfg.Bifrost, "bifrost", "", "with --peers: Bifrost's bifrost-http executable (none: Bifrost is left out)")
	fl.IntVar(&f.cfg.Rounds, "rounds", 3, "with --peers: rounds")
}

func runPeers(cmd *cobra.Command, f benchFlags) error {
	own, err := ownRunOf(cmd, f)
	if err != nil {
		return err
	}
	cfg := f.peers.cfg
	cfg.Binary, cfg.Log = own.binary, own.log
	if own.duration != 0 {
		cfg.Duration = own.duration
	}
	ctx, stop := signalContext(cmd.Context())
	defer stop()
	rep, err := benchrun.Peers(ctx, cfg)
	if err != nil {
		return err
	}
	return writeReport(cmd, f, rep, rep.WriteTable)
}
