// Package process is iop's assembly: it starts an edge, a node, or both in
// one process (dev) from a Config, as the iop command does, and stops them
// in the order iop's processes stop. cmd/iop parses flags and config files
// into a Config and wires signals to Drain and Abort; tests and embedders
// call Start directly (tailscale's tsnet and caddy's caddytest are the
// models).
//
//	p, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: logger})
//	...
//	p.Drain("SIGTERM") // or cancel ctx
//	err = p.Wait()
//
// # What it holds
//
//   - The process types (edgeProcess, agentProcess, devProcess): each opens
//     its resources in named steps (steps.go) and its Shutdown closes them
//     in reverse, so its step list is its drain order; a failed step closes
//     the ones opened before it.
//   - The process lifecycle and drain order (Start, Drain, Abort, Wait). An
//     edge drains its HTTP API up to its drain timeout, then ends what is
//     still going with an answer that says so (503, or a stream's error
//     event; outcome edge_stopped), waits up to 5s for those answers, ends
//     the background runs, flushes the ledger once every handler returned,
//     then stops its node endpoint. In dev, the in-process node drains after
//     the edge's requests ended (they need it) and before the node endpoint
//     stops. A node tells the edge it drains and lets its runs finish, up
//     to its drain timeout; Abort aborts them.
//   - The open-API policy: an edge without client keys serves only on a
//     loopback address unless insecure_open (AccessConfig), and logs what is
//     open.
//   - The signal policy of iop node (HandleSignals): the first SIGTERM or
//     SIGINT drains, the second aborts.
//   - The config file schema of each process kind: EdgeFile (edgefile.go)
//     nests the edge core's edge.Config and the process's own parts
//     (ServeConfig, HTTPConfig, AccessConfig, StoreConfig, tracing, the
//     local providers), each with its Validate; node.Config; DevConfig.
//     ConfigKinds builds the reference and iop check from them.
//   - Configuration layering (LoadConfig): defaults, then the YAML file,
//     then the flags the user set; and the reload loop (Config.Reload):
//     SIGHUP (Deps.Hangup) and a changed config file reload the edge's
//     configuration.
//   - The soak harness (Soak, `iop soak`).
//   - The edge file's schema (EdgeFile, edgefile.go): one part per
//     component, each validating its own; edge.go hands each part to its
//     component (the core to package edge, the HTTP part to edge/api).
//
// # Concurrency
//
// Start runs on the caller's goroutine and returns once the process serves.
// It then leaves these goroutines running, all ended by the time Wait
// returns except the last two of this list, which end just after it:
//   - ModeEdge and ModeDev: the gRPC server and the HTTP server; ModeDev
//     adds its node's Agent.Run and the simulators.
//   - ModeNode: Agent.Run.
//   - The watch loop (file events, Deps.Hangup, a settle timer), and with
//     Config.PprofListen the profiler's server; both end with Shutdown.
//   - One supervisor that waits for the process to end (the run context
//     ended by ctx, Drain or Abort, or a server failed; in ModeNode,
//     Agent.Run returned), runs Shutdown, and closes Wait's channel.
//   - HandleSignals adds one that reads the signals until the process
//     stops.
//
// Drain, Abort and Wait are safe from any goroutine at any time and any
// number of times. Drain and Abort only cancel contexts (and, in ModeNode,
// call Agent.Drain and log); they never block on the process. The run
// context says "drain" and the abort context says "stop waiting"; the
// supervisor reads both, and no lock of this package is held while it
// calls into the edge, the node or the ledger. The exported fields of a
// Process are written before Start returns and only read after.
package process
