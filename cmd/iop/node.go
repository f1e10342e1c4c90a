package main

import (
	"github.com/spf13/cobra"

	"iop/internal/node"
	"iop/internal/process"
)

func newNodeCommand(logLevel *string) *cobra.Command {
	var configPath, pprofListen string
	var cfg node.Config
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a node: dial the edge and serve its dispatches with local model servers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := setUp(cmd, *logLevel, configPath, &cfg)
			if err != nil {
				return err
			}
			pc := process.Config{Mode: process.ModeNode, Node: cfg, Version: version, PprofListen: pprofListen}
			if configPath != "" {
				// SIGHUP reads the file again under the flags the user set.
				pc.ReloadNode = func() (node.Config, error) {
					err := process.LoadConfig(cmd.Flags(), configPath, &cfg, func() { cfg = node.Config{DrainTimeout: node.DefaultDrainTimeout} })
					return cfg, err
				}
			}
			p, err := process.Start(cmd.Context(), pc, process.Deps{Logger: logger, Hangup: hangup()})
			if err != nil {
				return err
			}
			// The first SIGTERM or SIGINT drains the node (its runs in
			// flight may finish, up to --drain-timeout); the second aborts
			// them and stops at once.
			process.HandleSignals(p)
			return p.Wait()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configPath, "config", "", "YAML config file with the node's providers (flags override it)")
	fl.StringVar(&cfg.Edge, "edge", "", "edge node endpoint, host:port")
	fl.StringSliceVar(&cfg.Edges, "edges", nil, "node endpoints of several edges, host:port each (repeatable or comma-separated; a DNS name stands for every address it resolves to)")
	fl.DurationVar(&cfg.ResolveInterval, "resolve-interval", 0, "how often the DNS names of --edges are looked up again (default 30s)")
	fl.StringVar(&cfg.NodeID, "node-id", "", "node id (unique per edge)")
	fl.StringVar(&cfg.Label, "label", "", "human-readable node label")
	fl.StringVar(&cfg.Token, "token", "", "join token presented to the edge")
	fl.BoolVar(&cfg.TLS, "tls", false, "dial the edge over TLS (system roots unless --tls-ca)")
	fl.StringVar(&cfg.TLSCA, "tls-ca", "", "PEM CA the edge's certificate must chain to (implies --tls)")
	fl.StringVar(&cfg.TLSServerName, "tls-server-name", "", "name the edge's certificate must carry (default: the host of --edge)")
	fl.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM client certificate for mutual TLS")
	fl.StringVar(&cfg.TLSKey, "tls-key", "", "PEM key of --tls-cert")
	fl.IntVar(&cfg.RuntimeConcurrency, "runtime-concurrency", 0, "default provider capacity")
	fl.DurationVar(&cfg.DrainTimeout, "drain-timeout", node.DefaultDrainTimeout, "on SIGTERM or SIGINT, how long the runs in flight may take to finish before they are aborted (a second signal aborts them at once)")
	fl.StringVar(&pprofListen, "pprof-listen", "", "serve Go's profiler (/debug/pprof/) on this address (keep it on loopback)")
	return cmd
}
