// Package node is the node agent: the process that runs next to model
// servers, dials out to the edge (so it may sit behind NAT), advertises its
// providers, and runs the requests the edge dispatches to them through the
// adapters of package adapter. The wire protocol is
// iop/internal/wire/node.proto.
//
// # What lives where
//
//   - agent.go: Agent, New, Run (reconnect with backoff), Drain.
//   - edges.go: one link per edge address (Config.Edge or Config.Edges);
//     resolveName keeps one link per address a DNS name resolves to.
//   - session.go: one Connect stream (conn): Hello, Welcome, heartbeats,
//     edge messages, the drain (startDrain, drainDone).
//   - run.go: one run: admit checks a Dispatch, runOn serves it on its Run
//     stream, terminal builds its one last frame, eventSink and tunnelSink
//     send the answer up.
//   - warm.go: Run streams opened ahead of need (WarmStreams, serveWarm).
//   - capacity.go: the node's own slots per provider, shared by every
//     link (acquireSlot, slotWait, ErrProviderBusy).
//   - discovery.go, listing.go: adverts of discovered providers (round,
//     startDiscovery, helloNow, updatesSince; lister reads a server).
//   - residency.go: the models an Ollama provider holds loaded (/api/ps).
//   - show.go: the edge's /api/show requests, served by the node.
//   - inflight.go: a cluster's runs in flight and the highest epoch seen.
//   - kinds.go: providerKinds, one entry per provider type (protocol,
//     defaults, validation, adapter constructor).
//   - config.go, reload.go, tls.go, tracing.go: configuration and wiring.
//
// # Invariants
//
//   - One connection per edge, each with its own generation and backoff.
//   - A provider never runs more at once than its slots, whatever the edges.
//   - A run's data travels on its own Run stream, never the Connect stream.
//   - Every run sends exactly one terminal frame, and nothing after it.
//   - An aborted run sends no last frame; the edge ends it "node gone".
//   - After a drain began, every Dispatch is refused (ErrDraining).
//   - No advert change is missed or sent twice on one connection.
//   - No goroutine outlives Run.
//
// # Concurrency
//
// Agent fields set in New (config, logger, clock, providers, adapters,
// listers, slot pools) are never written again. At most one Run is active.
//
// Locks, each a leaf but conn.mu:
//
//   - Agent.mu: gens, links, genChanged, stopRun and the drain timer.
//   - Agent.slotMu: inFlight (every run of every link); run.slotMu: its slot.
//   - Agent.advMu: adverts and residency (replaced, never modified) and
//     advChanged, closed and replaced at every change.
//   - conn.mu: runs, draining, warm and unread; admit's drain check and
//     registration are one step under it. Agent.inflight's mutex (a leaf)
//     is the one lock taken under it, when a run is admitted.
//
// Goroutines:
//
//   - Run: one per link (l.run: owns its gRPC client, calls session once
//     per connection, in turn), one per DNS name (resolveName: starts and
//     retires its links), one per discovered provider (round), one per
//     Ollama provider (watchResidency).
//   - Per connection: the session goroutine (handles every edge message,
//     arms the heartbeat timer, starts and cancels runs); a reader, sole
//     caller of Connect's Recv; a writer, sole caller of its Send after
//     Hello, draining conn.out.
//   - Per run: one run goroutine, the only sender on its Run stream, and
//     one reader, the only caller of its Recv.
//   - Per warm stream: serveWarm, sole user of the stream until a Dispatch
//     arrives; then it is that run's goroutine, and the stream's one
//     reader (downReader, for the stream's life) is each of its runs'
//     reader in turn, parked between runs.
//   - Per ShowRequest: one goroutine (conn.auxWG, at most maxShows).
//   - Per ResidencyRequest: one goroutine (conn.auxWG; the edge asks for
//     one per provider at a time).
//   - Clock callbacks never block: a non-blocking send, a cancel, a close.
//
// A run's provider request is cancelled through its workCtx: a Cancel on
// the control stream or its run stream, the end of its run stream, or the
// end of the connection (every run context is a child of conn.ctx).
// session returns only after every goroutine of its connection ended.
package node
