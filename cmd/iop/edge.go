package main

import (
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"iop/internal/edge"
	"iop/internal/process"
)

func newEdgeCommand(logLevel *string) *cobra.Command {
	var configPath, pprofListen string
	var tokens []string
	cfg := process.EdgeFileDefaults()
	cmd := &cobra.Command{
		Use:   "edge",
		Short: "Run the edge: the HTTP API for clients, the gRPC endpoint for nodes, and the providers of its own host (providers:)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := setUp(cmd, *logLevel, configPath, &cfg)
			if err != nil {
				return err
			}
			for _, t := range tokens {
				cfg.Tokens = append(cfg.Tokens, edge.NodeToken{Token: t})
			}
			pc := process.Config{Mode: process.ModeEdge, Edge: cfg, Version: version, PprofListen: pprofListen}
			deps := process.Deps{Logger: logger, Hangup: hangup()}
			if configPath != "" {
				// The flags stay bound to cfg: each reload resets it, reads
				// the file and applies the flags the user set again.
				pc.ConfigFile = configPath
				pc.Reload = func() (process.EdgeFile, error) {
					err := process.LoadConfig(cmd.Flags(), configPath, &cfg, func() { cfg = process.EdgeFileDefaults() })
					return cfg, err
				}
			}
			p, err := process.Start(cmd.Context(), pc, deps)
			if err != nil {
				return err
			}
			// The first SIGTERM or SIGINT drains the edge (lame duck, then
			// the requests in flight up to drain_timeout); the second ends
			// what is still going, each with an answer that says so, and
			// stops at once. Handled, not left to the default disposition,
			// which is "ignored" for a process started with SIGINT ignored
			// (nohup, `cmd &` in a script) and for SIGTERM as PID 1.
			process.HandleSignals(p)
			return p.Wait()
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&configPath, "config", "", "YAML config file (flags override it)")
	fl.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API listen address")
	fl.StringVar(&cfg.NodeListen, "node-listen", cfg.NodeListen, "node endpoint (gRPC) listen address")
	fl.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "node heartbeat interval; 3 missed fence the connection")
	fl.DurationVar(&cfg.DispatchTimeout, "dispatch-timeout", cfg.DispatchTimeout, "how long a node may take to open a dispatched run")
	fl.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM or SIGINT: how long requests in flight may take before they are ended (a second signal stops at once)")
	fl.IntVar(&cfg.Queue.MaxQueue, "max-queue", cfg.Queue.MaxQueue, "default max queued requests per model")
	fl.DurationVar(&cfg.Queue.QueueTimeout, "queue-timeout", cfg.Queue.QueueTimeout, "default max time a request waits for a slot")
	fl.StringSliceVar(&tokens, "token", nil, "accepted node join token, for any node id (repeatable; added to the config's tokens; none at all = accept any node)")
	fl.StringVar(&cfg.Database, "database", cfg.Database, `SQLite file of run records and the usage ledger (":memory:" = not kept)`)
	fl.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate of the node endpoint (TLS)")
	fl.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM key of the node endpoint (TLS)")
	fl.StringVar(&cfg.ClientCA, "client-ca", cfg.ClientCA, "PEM CA that node client certificates must chain to (mutual TLS)")
	fl.StringVar(&cfg.KeysFile, "keys-file", cfg.KeysFile, "YAML file of client keys and admin_keys (hashes; see iop keys create)")
	fl.StringVar(&cfg.LedgerDSN, "ledger-dsn", cfg.LedgerDSN, "PostgreSQL DSN of the usage ledger (default: the --database file)")
	fl.StringVar(&cfg.RunsDSN, "runs-dsn", cfg.RunsDSN, "PostgreSQL DSN of the run records and their events, shared by several edges (default: the --database file)")
	fl.StringVar(&cfg.Name, "name", cfg.Name, "this edge's name among the edges sharing --runs-dsn (default: cluster.name, else the host name)")
	fl.BoolVar(&cfg.InsecureOpen, "insecure-open", cfg.InsecureOpen, "serve the client API without keys on a non-loopback address")
	addHTTPFlags(fl, &cfg.MaxBodyBytes, &cfg.WriteTimeout)
	fl.Var(optionalInt{&cfg.MaxRetries}, "max-retries", "times a request whose provider failed before the first byte (unreachable, 502, 503, 429) goes to another provider (0 = never)")
	fl.IntVar(&cfg.CircuitBreaker.Failures, "breaker-failures", cfg.CircuitBreaker.Failures, "failures in a row that take a provider out of rotation (negative = no circuit breaker)")
	fl.DurationVar(&cfg.CircuitBreaker.CoolDown, "breaker-cool-down", cfg.CircuitBreaker.CoolDown, "how long a failing provider stays out of rotation before a trial request")
	fl.DurationVar(&cfg.CircuitBreaker.MaxCoolDown, "breaker-max-cool-down", cfg.CircuitBreaker.MaxCoolDown, "cap of the cool-down, which doubles after each failed trial")
	fl.StringVar(&pprofListen, "pprof-listen", "", "serve Go's profiler (/debug/pprof/) on this address (keep it on loopback)")
	return cmd
}

// optionalInt is a flag bound to an optional int of a config (a *int whose
// nil means the config's default).
type optionalInt struct{ p **int }

func (o optionalInt) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return strconv.Itoa(**o.p)
}

func (o optionalInt) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	*o.p = &n
	return nil
}

func (o optionalInt) Type() string { return "int" }

// addHTTPFlags adds the HTTP API's limits, shared by edge and dev.
func addHTTPFlags(fl *pflag.FlagSet, maxBodyBytes *int64, writeTimeout *time.Duration) {
	fl.Int64Var(maxBodyBytes, "max-body-bytes", *maxBodyBytes, "largest client request body, in bytes (413 above it)")
	fl.DurationVar(writeTimeout, "write-timeout", *writeTimeout, "cancel a run whose client reads nothing for this long")
}
