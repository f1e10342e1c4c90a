package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"iop/internal/edge"
	"iop/internal/ledger"
	"iop/internal/node"
	"iop/internal/tracing"
)

// Mode is what a Process runs.
type Mode string

const (
	// ModeEdge runs an edge (`iop edge`): the HTTP API for clients and the
	// gRPC endpoint for nodes.
	ModeEdge Mode = "edge"
	// ModeNode runs a node (`iop node`): it dials the edge and serves its
	// dispatches with local model servers.
	ModeNode Mode = "node"
	// ModeDev runs an edge and an in-process node (`iop dev`), with a local
	// Ollama if one answers, else the simulator.
	ModeDev Mode = "dev"
)

// Config is what Start starts.
type Config struct {
	Mode Mode
	// Edge configures ModeEdge. Its Database "" keeps run records and the
	// ledger in memory (EdgeDefaults is iop edge's, with iop.db).
	Edge edge.Config
	// Node configures ModeNode. An empty Version is set to Version.
	Node node.Config
	// Dev configures ModeDev (DevDefaults is iop dev's).
	Dev DevConfig
	// Version is the node's version as it reports it to the edge (ModeNode
	// unless Node.Version is set; ModeDev's in-process node).
	Version string
	// Reload, when set (ModeEdge), reads the edge's configuration again (for
	// iop edge: the file under the flags the user set); it is called at each
	// value from Deps.Hangup and whenever the file ConfigFile changes
	// (watched through its directory, so a file replaced by rename is seen),
	// and its result goes to edge.Service.Reload. A configuration that
	// cannot be read or is invalid is refused with an error log line, and
	// the running one stays.
	Reload     func() (edge.Config, error)
	ConfigFile string
	// ReloadNode (ModeNode) and ReloadDev (ModeDev), when set, read the
	// configuration again at each value from Deps.Hangup: the node applies
	// its providers' capacities, discovery intervals and TLS files
	// (node.Agent.Reload); iop dev its api_key and discovery_interval. What
	// needs a restart is logged; a configuration that cannot be read or is
	// invalid is refused with an error log line, and the running one stays.
	ReloadNode func() (node.Config, error)
	ReloadDev  func() (DevConfig, error)
	// PprofListen, when set (ModeEdge, ModeNode), serves Go's profiler
	// (/debug/pprof/) on this address until the process stops (ModeEdge:
	// until it starts draining). Keep it on loopback: it is unauthenticated.
	PprofListen string
}

// Deps are what a Process takes from its surroundings.
type Deps struct {
	// Logger gets the process's log lines; nil discards them (NewLogger
	// makes iop's).
	Logger *slog.Logger
	// Stdout, when set, gets ModeDev's banner (where it listens and what to
	// try) once the process is ready.
	Stdout io.Writer
	// Hangup reloads the configuration (Config.Reload, ReloadNode,
	// ReloadDev) at each value; every iop process passes SIGHUP. Without a
	// reload function each value is logged as having nothing to reload.
	// Nil: only a changed file reloads (ModeEdge).
	Hangup <-chan os.Signal
}

// Process is a running edge, node or dev stack, made by Start. Its
// exported fields are set before Start returns and not changed after.
type Process struct {
	Mode Mode
	// HTTPAddr and NodeAddr are the host:port the edge's HTTP API and node
	// endpoint listen on (ModeEdge, ModeDev).
	HTTPAddr string
	NodeAddr string
	// Service and Ledger are the edge's dispatch service and usage ledger
	// (ModeEdge, ModeDev).
	Service *edge.Service
	Ledger  *ledger.Ledger
	// Agent is the node (ModeNode) or the in-process node (ModeDev).
	Agent *node.Agent
	// Dev says what a ModeDev process serves; nil in the other modes.
	Dev *DevInfo

	logger    *slog.Logger
	stop      context.CancelFunc // ends the run context: edge and dev drain
	abort     context.CancelFunc // ends the abort context: waits are cut short
	onDrain   func(reason string)
	drainOnce sync.Once
	done      chan struct{} // closed when the process has stopped; err is then set
	err       error
}

// Start starts cfg.Mode and returns once it serves: ModeEdge once both
// listeners are open (and the reload watch is set up), ModeDev once its
// in-process node is connected, ModeNode once its agent runs (it dials the
// edge and redials on its own; Agent.Ready says when it is connected).
// Errors: an invalid configuration, a listener or watch that cannot be
// set up, a ModeDev node that does not connect within 30s; nothing is left
// running then.
//
// When ctx ends the process drains, as Drain does (ModeNode with the
// reason "context ended").
func Start(ctx context.Context, cfg Config, deps Deps) (*Process, error) {
	logger := deps.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	runCtx, stop := context.WithCancel(ctx)
	abortCtx, abort := context.WithCancel(context.Background())
	p := &Process{Mode: cfg.Mode, logger: logger, stop: stop, abort: abort, done: make(chan struct{})}
	var err error
	switch cfg.Mode {
	case ModeEdge:
		err = p.startEdge(runCtx, abortCtx, cfg, deps)
	case ModeNode:
		err = p.startNode(ctx, abortCtx, cfg, deps)
	case ModeDev:
		err = p.startDev(runCtx, abortCtx, cfg, deps)
	default:
		err = fmt.Errorf("process: unknown mode %q (want edge, node or dev)", cfg.Mode)
	}
	if err != nil {
		stop()
		abort()
		return nil, err
	}
	return p, nil
}

// Drain stops the process as the first SIGTERM or SIGINT does: an edge
// (ModeEdge, ModeDev) drains its HTTP API (up to its drain timeout), ends
// what is still going with an answer that says so, and stops; ModeDev's
// node then drains; a node (ModeNode) tells the edge (reason goes with its
// Drain message, e.g. "SIGTERM") and lets its runs in flight finish, up to
// its drain timeout. It returns at once; Wait waits for the end. Calls
// after the first (or after Abort) do nothing. Safe from any goroutine.
func (p *Process) Drain(reason string) {
	p.drainOnce.Do(func() {
		if p.onDrain != nil {
			p.onDrain(reason)
		}
		p.stop()
	})
}

// Abort stops the process at once, as a second signal does: a node's runs
// in flight are aborted; an edge ends its requests in flight now (with the
// answer Drain gives them at its drain timeout) instead of waiting for
// them; ModeDev's node is aborted instead of drained. It returns at once;
// Wait waits for the end. Safe from any goroutine, any number of times.
func (p *Process) Abort() {
	p.abort()
	p.drainOnce.Do(func() {})
	p.stop()
}

// Wait blocks until the process has stopped and returns why: nil after a
// drain or abort that went well, else what failed (a listener, the ledger,
// the node's run).
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// finish records err as the process's result, after waiting for each of
// also (closed when a helper goroutine ended), and releases the contexts.
func (p *Process) finish(err error, also ...<-chan struct{}) {
	p.stop()
	for _, c := range also {
		if c != nil {
			<-c
		}
	}
	p.abort()
	p.err = err
	close(p.done)
}

// startEdge starts ModeEdge: the profiler, the edge, the reload watch.
func (p *Process) startEdge(ctx, abort context.Context, cfg Config, deps Deps) error {
	if err := servePprof(ctx, cfg.PprofListen); err != nil {
		return err
	}
	e, err := startEdge(ctx, abort, cfg.Edge, p.logger, nil)
	if err != nil {
		return err
	}
	p.HTTPAddr, p.NodeAddr, p.Service, p.Ledger = e.HTTPAddr, e.NodeAddr, e.Service, e.Ledger
	r := &edgeReloader{e: e, logger: p.logger}
	watched, err := watchConfig(ctx, cfg.ConfigFile, reloadFunc(cfg.Reload, r.apply, p.logger), p.logger, deps.Hangup)
	if err != nil {
		p.stop() // stops the edge
		return errors.Join(err, e.Wait())
	}
	p.logger.Info("edge ready", "http", "http://"+e.HTTPAddr, "node_endpoint", e.NodeAddr)
	go func() { p.finish(e.Wait(), watched) }()
	return nil
}

// startNode starts ModeNode: the agent runs until its drain is over or
// abort ends; ctx ending drains it.
func (p *Process) startNode(ctx, abort context.Context, cfg Config, deps Deps) error {
	ncfg := cfg.Node
	if ncfg.Version == "" {
		ncfg.Version = cfg.Version
	}
	tr, err := tracing.Start(ctx, ncfg.Tracing, nil, "iop-node", p.logger)
	if err != nil {
		return err
	}
	agent, err := node.New(ncfg, p.logger, node.WithTracer(tr.Tracer))
	if err != nil {
		shutdownTracing(tr, p.logger)
		return err
	}
	p.Agent = agent
	p.onDrain = func(reason string) {
		p.logger.Info("node stopping: draining; a second signal stops it at once", "signal", reason, "drain_timeout", ncfg.DrainTimeout)
		agent.Drain(reason)
	}
	if err := servePprof(abort, cfg.PprofListen); err != nil {
		return err
	}
	apply := func(c node.Config, trigger string) error {
		if c.Version == "" {
			c.Version = ncfg.Version
		}
		return reloadNode(agent, c, trigger, p.logger)
	}
	watched, err := watchConfig(abort, "", reloadFunc(cfg.ReloadNode, apply, p.logger), p.logger, deps.Hangup)
	if err != nil {
		return err
	}
	p.logger.Info("node starting", "node_id", ncfg.NodeID, "edge", ncfg.Edge, "edges", ncfg.Edges, "providers", len(ncfg.Providers))
	stopDrainOnCtx := context.AfterFunc(ctx, func() { p.Drain("context ended") })
	go func() {
		defer func() { <-watched }()
		err := agent.Run(abort)
		if abort.Err() != nil {
			p.logger.Warn("second signal: the runs still in flight were aborted", "node_id", ncfg.NodeID)
		}
		p.logger.Info("node stopped", "node_id", ncfg.NodeID, "err", err)
		shutdownTracing(tr, p.logger) // exports the last runs' spans
		stopDrainOnCtx()
		p.finish(err)
	}()
	return nil
}

// startDev starts ModeDev and prints its banner to deps.Stdout.
func (p *Process) startDev(ctx, abort context.Context, cfg Config, deps Deps) error {
	d, err := startDev(ctx, abort, cfg.Dev, cfg.Version, p.logger)
	if err != nil {
		return err
	}
	p.HTTPAddr, p.NodeAddr, p.Service, p.Ledger = d.Edge.HTTPAddr, d.Edge.NodeAddr, d.Edge.Service, d.Edge.Ledger
	p.Agent, p.Dev = d.Agent, &d.DevInfo
	watched, err := watchConfig(ctx, "", reloadFunc(cfg.ReloadDev, d.reload, p.logger), p.logger, deps.Hangup)
	if err != nil {
		p.stop()
		return errors.Join(err, d.Wait())
	}
	if deps.Stdout != nil {
		printBanner(deps.Stdout, d)
	}
	go func() { p.finish(d.Wait(), watched) }()
	return nil
}

// NewLogger returns iop's logger on w at level ("debug", "info", "warn",
// "error"), in format "text" (slog's key=value lines) or "json" (one JSON
// object a line). Errors name the flag (--log-level, --log-format) whose
// value is bad.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", format)
	}
}
