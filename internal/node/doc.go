// Package node is the node agent: the process that runs next to model
// servers, dials out to the edge (so it may sit behind NAT), advertises its
// providers, and runs the requests the edge dispatches to them through the
// adapters of package adapter.
//
// # Protocol (iop/internal/wire/node.proto)
//
// The agent keeps one Connect stream open to each edge (Config.Edge, or
// every edge of Config.Edges: see "Several edges" below): it sends Hello (node id, label,
// token, providers with type, served models, capacity, long capacity,
// capabilities, execution path, healthy, version) and waits for Welcome
// (generation, heartbeat interval) or HelloRefused. After Welcome it sends a
// Heartbeat every interval and drops the connection when nothing at all has
// arrived from the edge for three intervals. A broken stream, a refusal, a
// missing Welcome or missed heartbeats all end the connection; the agent
// then waits (exponential backoff from ReconnectMin to ReconnectMax, full
// jitter, reset after a Welcome) and connects again, getting a new
// generation.
//
// # Several edges
//
// With Config.Edges the node keeps one connection (a link, edges.go) per
// edge: each has its own Hello/Welcome, generation (generations are per
// (node, edge)), heartbeats, warm streams and reconnect backoff, so one
// edge lost or restarting leaves the others' connections and runs alone.
// An entry whose host is a DNS name stands for every address it resolves
// to (IPv4 ones if it has any, else IPv6), each its own link dialed by
// address with the name as TLS server name and :authority; the name is
// looked up again every Config.ResolveInterval (30s): a new address gets a
// link, one gone has its link drained (Drain{"edge address no longer
// resolved"}, its runs may finish up to DrainTimeout) and closed; a failed
// or empty lookup changes nothing. Agent.Drain drains every link.
//
// Provider capacity is the node's as well as the edges' (capacity.go):
// every link's runs share each provider's max(capacity, long_capacity)
// slots, so however many edges send dispatches, a provider never runs
// more at once. A Dispatch whose provider is full waits up to slotWait (1s,
// the agent's clock) for a slot (an edge frees its slot as it reads a
// run's end or cancels it, a moment before the node's run is over), then
// is refused (DispatchRefused, ErrProviderBusy). A run's slot is freed just
// before its terminal frame is sent. Agent.RunsInFlight lists every run of
// every link.
//
// # Discovery
//
// A provider that omits its models (any type but cli) is discovered: Run
// first reads, for every such provider at once, what its server serves
// (Ollama: GET /api/tags, then POST /api/show per model not shown yet with
// its digest, for capabilities, parent model and context length; an
// OpenAI-compatible server: GET {base_url}/models), then reads it again
// every discovery interval of the agent's clock. Its advert (health, served
// models sorted, and per model its capabilities — "stream" and what the
// server says in iop's words, or the configured capabilities, which
// override the server's — and details) is what Hello says of it and, at
// every change, what a ProviderUpdate (models_set, the whole list) carries:
// a model pulled or removed, a server that stops answering its listing
// (unhealthy, models kept) or answers again. A round that finds nothing new
// sends nothing. A provider whose server did not answer yet is advertised
// unhealthy with no models. A provider with configured models is
// advertised healthy with exactly those, and its server is never read.
//
// A Dispatch for a known provider starts a run: the agent opens a Run
// stream of its own for it (so HTTP/2 flow control applies to that run
// alone and a slow reader backpressures only its own run), sends RunOpen,
// takes the body from the Dispatch when it came inline (calling the
// provider at once) or else receives its chunks, drives the adapter and
// sends the answer up:
// run events on the normalized path, TunnelHead/TunnelData/TunnelEnd on the
// tunnel path (a small whole answer as one TunnelHead with its body and
// end, and no TunnelEnd after it). A Dispatch it cannot run gets DispatchRefused; one
// above its provider's capacity on this node, too (see "Several edges").
//
// Warm streams (warm.go): after Welcome each connection keeps WarmStreams
// (2) Run streams open ahead of need, opened with RunOpen{idle, node id,
// generation} and no run. The edge sends a Dispatch down one instead of on
// the control stream; the node checks it as a control-stream Dispatch
// (admit: draining, run id, provider, path, operation, a run id in
// flight), serves it on that stream as on one of its own, and opens
// another warm stream in its place; a Dispatch it cannot run is refused on
// that stream (RunUp.refused). Each run on a warm stream is acknowledged
// first with RunOpen naming it. After a run's terminal frame the node sends
// nothing more of it (eventSink drops anything after a terminal event) and
// keeps the stream open, not half-closed: the edge either ends it or, after
// a clean end, sends the next run's Dispatch down it, which the node serves
// the same way (a run that sent no terminal frame half-closes the stream,
// as on one of its own, so the edge ends it as aborted). A warm stream the edge ends without a
// Dispatch (its connection ended or drains, the edge refused the stream or
// stops) is not replaced, so an edge that refuses them is not asked
// again.
//
// # Drain
//
// Agent.Drain (`iop node` on SIGTERM or SIGINT) sends Drain{reason} on the
// control stream, after which every Dispatch is refused (ErrDraining) and
// the runs in flight go on. When the last one has finished, and the edge
// has ended or reused the warm stream of every run that finished on one
// (so it has read each run's last frame: a frame only queued on the
// stream was lost with the connection), the agent sends what is still queued, half-closes the control stream, waits (up to
// flushTimeout) for the edge to end it, and Run returns nil without
// reconnecting. Config.DrainTimeout after Drain, on the agent's clock, the
// runs still going are aborted as when Run's context ends. An aborted run
// (Run's context ended, the drain's grace period over, the connection
// lost) sends no last frame and does not half-close its stream: the edge
// ends it, like every run of a connection that closed, with its node gone,
// so each client of an aborted run sees that one error.
//
// # Concurrency
//
// Agent fields set in New (config, logger, clock, providers and their
// adapters and listers, the provider slot channels) are never written
// again. At most one Run is active per Agent. Run starts one goroutine per
// link (edges.go: it owns the link's gRPC client connection and calls
// session once per connection, sequentially), one per DNS name of
// Config.Edges (resolveName: it alone starts and retires that name's
// links), and waits for them all. Each link has one more goroutine that
// turns the agent's drain into the link's (or, for a retired link, runs
// its drain timer). Agent.mu guards gens (the generation of each welcomed
// connection, written by its session goroutine), links, and genChanged,
// the channel closed on each generation change (tests wait on it). ready
// is closed once, at the first Welcome of any link. Agent.slotMu guards
// inFlight (every run of every link); a run's slot field is guarded by its
// slotMu, taken by acquireSlot on the run's goroutine and freed once by
// releaseSlot (its sinks, runOn, or untrack). Agent.inflight, the
// node-wide set of a cluster's runs in flight (inflight.go: reported in
// heartbeats and to a new scheduler leader, and the highest epoch seen),
// has its own leaf mutex, taken under conn.mu when a dispatch is admitted.
//
// Discovery: Run starts one goroutine per discovered provider (after a
// first round run by goroutines it waits for), the only one that runs that
// provider's rounds and uses its lister; it sleeps on the agent's clock
// between rounds and ends with Run (Run waits for it). Agent.advMu guards
// the adverts (replaced, never modified: a published advert's slices and
// messages are shared read-only with the Hellos and updates built from
// them) and advChanged, closed and replaced at every change. Each session
// goroutine builds its Hello from a snapshot (advert versions and the
// channel of that instant), and on each close of the channel queues a
// ProviderUpdate for every advert whose version moved since it last sent,
// so no change between the snapshot and the loop is missed and none is
// sent twice on one connection.
//
// Residency (residency.go): Run starts one goroutine per Ollama provider,
// the only one that reads its /api/ps (at once, every discovery interval,
// and after a run on it ends for a model the last reading did not show
// loaded: kickResidencyAfter fills its one-slot kick, at most one reading
// per residencyGap). It publishes under advMu into
// Agent.residency (versioned, replaced, never modified) and closes
// advChanged like an advert; sessions send the loaded models alone
// (ProviderUpdate.loaded_set) when only they changed.
//
// /api/show (show.go): the session goroutine hands each ShowRequest to a
// goroutine of its own (conn.auxWG; at most maxShows at once, the
// conn.shows tokens), which calls the server and queues the ShowAnswer
// parts on the control stream's queue; the session waits for them when
// it ends.
//
// Each connection (conn) has:
//   - the session goroutine (the one that called session): it alone arms
//     the heartbeat timer (one at a time, re-armed after each tick) and
//     keeps the time the edge was last heard from; it handles every edge
//     message, starts runs and cancels them. Clock callbacks (heartbeat
//     tick, hello timeout, backoff wake-up) run on the clock's goroutine
//     (clock.Real) or inside Advance (clock.Fake) and never block: a
//     non-blocking send, a context cancel, or a channel close;
//   - a reader goroutine, the only caller of the Connect stream's Recv,
//     handing messages to the session goroutine over an unbuffered channel;
//   - a writer goroutine, the only caller of the Connect stream's Send after
//     Hello, draining conn.out (heartbeats, DispatchRefused, ProviderUpdate,
//     Drain); at the end of a drain it sends what is queued and half-closes
//     the stream;
//   - one goroutine per run, plus one reader per run (the only caller of
//     that Run stream's Recv). The run goroutine is the only sender on its
//     Run stream: the adapter's sink calls and the terminal frame all happen
//     on it, in order. Run data never passes through the Connect stream or
//     any channel shared with other runs. A traced run's spans (runSpans,
//     WithTracer) and the time its terminal frame was sent belong to it too;
//   - one goroutine per warm stream (serveWarm), the only caller of its
//     Recv and Send until a Dispatch arrives; it then becomes that run's
//     goroutine (runOn, with its reader), and before serving it starts the
//     warm stream that replaces it (refillWarm; counted in runWG like the
//     runs); when the edge reuses the stream it serves the next run the
//     same way, one at a time.
//
// conn.mu guards conn.runs (run id -> run), conn.draining, conn.warm
// (the warm streams opening or idle) and conn.unread (runs finished on a
// warm stream the edge has not yet ended or reused): the session goroutine and warm
// stream goroutines add runs (admit: the draining check and the add are
// one step, so a drain that found no run in flight admits none after it),
// the session goroutine looks them up to cancel; each run goroutine
// removes itself when done and then signals conn.runEnded (one slot, never
// blocking), on which a draining session goroutine waits for the last
// run. conn.draining is written by the session goroutine alone. Agent.draining is closed once, by Drain, after
// Agent.drainReason is written; Agent.mu guards stopRun (the active Run's
// cancel, which the drain's grace timer calls) and the drain's timer.
// A run's provider request is cancelled, exactly through its workCtx, by a
// Cancel on the control stream, a Cancel on its run stream, the end of its
// run stream, or the end of the connection (every run context is a child of
// the connection's). The run goroutine alone sends the run's terminal frame,
// once (see terminal), then half-closes and waits for the edge to end the
// stream. session returns only after every run, reader and writer goroutine
// of its connection has finished, and Run only after its last session, so
// no goroutine outlives Run.
package node
