package process

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"iop/internal/edge"
	"iop/internal/ledger"
	"iop/internal/node"
	"iop/internal/tracing"
	"iop/internal/wire/nodev1"
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
	// Edge configures ModeEdge: its file (DefaultEdgeFile keeps run
	// records and the ledger in memory; EdgeFileDefaults is iop edge's,
	// with iop.db). Its Providers, when set, are served by a node in the
	// edge's own process, connected in memory (package memlink), named
	// LocalNodeID ("" is DefaultLocalNodeID).
	Edge EdgeFile
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
	// and its result goes to edge.Service.Reload (its providers and
	// local_node_id apply at the next start). A configuration that
	// cannot be read or is invalid is refused with an error log line, and
	// the running one stays.
	Reload     func() (EdgeFile, error)
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
	// Steps, when set, is called before each open step of the process
	// with ("open", name) and before each close step with ("close",
	// name), in the order they run (Shutdown's is the open order
	// reversed). An error it returns for an open step fails that step:
	// Start closes the steps opened before it and returns the error.
	// Tests use it to watch and break the order.
	Steps func(phase, name string) error
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
	// NodeLink reaches the edge in memory (ModeEdge, ModeDev): a node
	// made with node.WithGateway(NodeLink) is a node in the edge's own
	// process.
	NodeLink nodev1.NodeGatewayClient
	// Agent is the node (ModeNode) or the in-process node (ModeDev, and
	// ModeEdge with LocalProviders).
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

// processType is one kind of process: edgeProcess, agentProcess or
// devProcess. Each opens its resources in named steps and closes them in
// reverse (steps).
type processType interface {
	// Open opens the steps in order; ctx is the run context. On an error
	// the steps opened are closed again.
	Open(ctx context.Context) error
	// until blocks until the process should stop (ctx, the run context,
	// ended, a server failed, a node's Run returned) and returns the
	// failure, if any.
	until(ctx context.Context) error
	// Shutdown closes the opened steps in reverse; ctx ending cuts its
	// waits short (Abort).
	Shutdown(ctx context.Context) error
	// export sets the exported fields of p from the opened process.
	export(p *Process)
}

var (
	_ processType = (*edgeProcess)(nil)
	_ processType = (*agentProcess)(nil)
	_ processType = (*devProcess)(nil)
)

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
	var proc processType
	switch cfg.Mode {
	case ModeEdge:
		e := &edgeProcess{cfg: cfg.Edge, logger: logger, pprofListen: cfg.PprofListen, configFile: cfg.ConfigFile, hangup: deps.Hangup}
		if len(cfg.Edge.Providers) > 0 {
			id := cfg.Edge.LocalNodeID
			if id == "" {
				id = DefaultLocalNodeID
			}
			e.local = &localNode{logger: logger, reason: "edge stopping", cfg: node.Config{
				NodeID: id, Label: "in the edge's process", Version: cfg.Version, Providers: cfg.Edge.Providers}}
		}
		r := &edgeReloader{e: e, logger: logger}
		e.reload = reloadFunc(cfg.Reload, r.apply, logger)
		e.steps.hook = deps.Steps
		proc = e
	case ModeNode:
		ncfg := cfg.Node
		if ncfg.Version == "" {
			ncfg.Version = cfg.Version
		}
		n := &agentProcess{cfg: ncfg, load: cfg.ReloadNode, pprofListen: cfg.PprofListen, hangup: deps.Hangup,
			logger: logger, parent: ctx, abort: abortCtx, drain: p.Drain}
		n.steps.hook = deps.Steps
		p.onDrain = n.drainAgent
		proc = n
	case ModeDev:
		d := &devProcess{cfg: cfg.Dev, version: cfg.Version, load: cfg.ReloadDev, stdout: deps.Stdout, hangup: deps.Hangup, logger: logger}
		d.steps.hook = deps.Steps
		proc = d
	default:
		stop()
		abort()
		return nil, fmt.Errorf("process: unknown mode %q (want edge, node or dev)", cfg.Mode)
	}
	if err := proc.Open(runCtx); err != nil {
		stop()
		abort()
		return nil, err
	}
	proc.export(p)
	go func() {
		err := proc.until(runCtx)
		if serr := proc.Shutdown(abortCtx); err == nil {
			err = serr
		}
		p.finish(err)
	}()
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

// finish records err as the process's result and releases the contexts.
func (p *Process) finish(err error) {
	p.stop()
	p.abort()
	p.err = err
	close(p.done)
}

// agentProcess is a node (ModeNode): its agent runs until its drain is
// over or the abort context ends; the parent context ending drains it.
// Its resources are the steps Open lists; Shutdown closes them in
// reverse.
type agentProcess struct {
	cfg         node.Config
	load        func() (node.Config, error) // Config.ReloadNode; nil: nothing to read again
	pprofListen string
	hangup      <-chan os.Signal
	logger      *slog.Logger
	parent      context.Context // Start's: its end drains the node
	abort       context.Context // Abort's: its end stops Run at once
	drain       func(reason string)

	// Set by the open steps, in order; read-only once Open has returned.
	tr             *tracing.Tracing
	agent          *node.Agent
	stopPprof      func()
	stopWatch      func()
	stopDrainOnCtx func() bool
	runDone        chan struct{} // closed when Run has returned; runErr is then set
	runErr         error
	steps          steps
}

// Open opens the node's steps: tracing, the agent, the profiler, the
// reload watch, and the agent's Run.
func (n *agentProcess) Open(ctx context.Context) error {
	return n.steps.open(ctx, []step{
		{name: "tracing", open: n.openTracing, close: n.closeTracing},
		{name: "agent", open: n.openAgent},
		{name: "profiler", open: n.openPprof, close: n.closePprof},
		{name: "reload watcher", open: n.openWatch, close: n.closeWatch},
		{name: "run", open: n.startRun, close: n.endRun},
	})
}

// Shutdown closes what Open opened, in reverse: it waits for the agent's
// Run to end (after its drain, or at once when ctx ends), stops the
// reload watch and the profiler, and exports the last runs' spans.
func (n *agentProcess) Shutdown(ctx context.Context) error { return n.steps.close(ctx) }

func (n *agentProcess) export(p *Process) { p.Agent = n.agent }

// until waits for the agent's Run to return and returns its error.
func (n *agentProcess) until(context.Context) error {
	<-n.runDone
	return n.runErr
}

// drainAgent is the node's Process.Drain: it logs and drains the agent.
func (n *agentProcess) drainAgent(reason string) {
	n.logger.Info("node stopping: draining; a second signal stops it at once", "signal", reason, "drain_timeout", n.cfg.DrainTimeout)
	n.agent.Drain(reason)
}

func (n *agentProcess) openTracing(context.Context) (err error) {
	n.tr, err = tracing.Start(n.parent, n.cfg.Tracing, nil, "iop-node", n.logger)
	return err
}

// closeTracing exports the last runs' spans.
func (n *agentProcess) closeTracing(context.Context) error {
	shutdownTracing(n.tr, n.logger)
	return nil
}

func (n *agentProcess) openAgent(context.Context) (err error) {
	n.agent, err = node.New(n.cfg, n.logger, node.WithTracer(n.tr.Tracer))
	return err
}

// openPprof serves the profiler at pprofListen (if set) until Shutdown.
func (n *agentProcess) openPprof(context.Context) (err error) {
	n.stopPprof, err = servePprof(n.pprofListen)
	return err
}

func (n *agentProcess) closePprof(context.Context) error {
	n.stopPprof()
	return nil
}

// openWatch reloads the node's configuration at each SIGHUP, until
// Shutdown: capacities, discovery intervals, TLS files (reloadNode).
func (n *agentProcess) openWatch(context.Context) (err error) {
	apply := func(c node.Config, trigger string) error {
		if c.Version == "" {
			c.Version = n.cfg.Version
		}
		return reloadNode(n.agent, c, trigger, n.logger)
	}
	n.stopWatch, err = watchConfig("", reloadFunc(n.load, apply, n.logger), n.logger, n.hangup)
	return err
}

func (n *agentProcess) closeWatch(context.Context) error {
	n.stopWatch()
	return nil
}

// startRun runs the agent until its drain is over or the abort context
// ends; the parent context ending drains it.
func (n *agentProcess) startRun(context.Context) error {
	n.logger.Info("node starting", "node_id", n.cfg.NodeID, "edge", n.cfg.Edge, "edges", n.cfg.Edges, "providers", len(n.cfg.Providers))
	n.stopDrainOnCtx = context.AfterFunc(n.parent, func() { n.drain("context ended") })
	n.runDone = make(chan struct{})
	go func() {
		defer close(n.runDone)
		n.runErr = n.agent.Run(n.abort)
	}()
	return nil
}

// endRun waits for the agent's Run to return (the abort context ending
// stops it at once) and logs how it ended.
func (n *agentProcess) endRun(context.Context) error {
	<-n.runDone // Run's context is the abort context
	if n.abort.Err() != nil {
		n.logger.Warn("second signal: the runs still in flight were aborted", "node_id", n.cfg.NodeID)
	}
	n.logger.Info("node stopped", "node_id", n.cfg.NodeID, "err", n.runErr)
	n.stopDrainOnCtx()
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
