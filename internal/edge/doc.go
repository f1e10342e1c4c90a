// Package edge is the edge's core: the node registry, the model catalog, the
// gRPC NodeGateway endpoint nodes dial, and the dispatch Service the HTTP API
// (package edge/api) calls. The admission decisions are the scheduler's
// (package scheduler); this package feeds it live candidates and node
// lifecycle, and carries admitted requests to nodes and their answers back.
// Service admits through one admission (admission.go): localAdmission on a
// single edge, clusterMode (cluster.go) for several; a run holds the grant
// either returns. clusterMode reaches the election through an elector and
// the other edges through a peerNet (etcd and gRPC in production; a
// simulated election and network in TestClusterProtocolSim).
//
// What the HTTP API asks and gets back is package edge/contract's: Request,
// DispatchInfo, Snapshot, ModelInfo, the dispatch errors and Outcome. This
// package's names for them are aliases, and the scheduler's admission errors
// are wrapped with the contract's once, where Service.Dispatch returns
// (boundaryError); the wire protocol's operation and execution path are
// mapped to the contract's there too.
//
// # Nodes and generations
//
// A node opens one Connect stream (DESIGN.md "Edge ↔ node protocol"). Its
// Hello is validated (non-empty node_id; at least one provider; provider ids
// unique and non-empty; each healthy provider at least one model — a
// provider whose node discovers its models may come unhealthy with none
// yet; no empty model name; model_capabilities entries named, at most one
// per model; capacity and
// long_capacity ≥ 0, capacity 0 meaning runtime_concurrency, else 1,
// long_capacity 0 meaning capacity; a known execution path; an accepted
// token when Config.Tokens is set, that the node id may present; and a
// node id bound to no other token: the first accepted Hello of a node id
// binds it to its token's hash for the edge's lifetime, in memory, so no
// node with another token can take over its id — trust.go). A bad Hello
// gets HelloRefused{reason} and the stream ends; the node id's current
// connection, if any, is untouched; the edge keeps serving. With
// Config.TLSCert the endpoint speaks TLS only (mutual TLS with ClientCA). An accepted one gets a
// generation greater than every one handed out before, replaces (and
// closes) the node's previous connection, is answered Welcome, and its
// providers are activated in the scheduler. When the stream ends, the node
// is silent for 3 heartbeat intervals, a newer connection replaces it, or
// the edge stops, the generation is fenced: its leases are released, its
// resources orphaned, its unfinished runs end with ErrNodeGone. An orphan
// resource is dropped from the scheduler, and from Snapshot (the admin
// API's providers), once no lease holds it and no request waits for it.
//
// A node whose connection ended and was not replaced is gone. The edge
// remembers it for ForgetAfter (10 minutes): its last connection's
// providers still count as configured (see Catalog), the model names only
// it served stay known, and its circuit breakers keep their state. The
// first connect or disconnect of any node after that forgets it, so nodes
// that come and go leave no state behind (the node id's token binding,
// trust.go, is kept for the edge's lifetime on purpose).
//
// A node that is shutting down sends Drain. Its connection is then
// draining (NodeSnapshot.Draining; its providers' status "draining"): its
// providers are no candidates, like unhealthy ones, so new requests go to
// other nodes; queued requests re-resolve their candidates, and those left
// with none fail with scheduler.ErrProviderUnavailable; its runs in flight
// go on to their end. A dispatch it refuses after Drain (sent before the
// Drain arrived) is admitted again elsewhere, without counting against its
// provider's circuit. When its runs are done the node closes the
// connection, which is fenced as any other ("node drained").
//
// # Catalog
//
// A requested model name is a configured alias, resolving to its targets,
// or a served model name a current connection serves or one served less
// than ForgetAfter ago, resolving to itself. Its candidates are the
// healthy providers of current connections serving a target. Names are
// compared by one rule, package modelname's (Ollama's: "x" is
// "x:latest"): a target "x" is served by a provider listing "x:latest" and
// the other way round, and the dispatch names the model as the provider
// lists it. An alias none of whose targets a node serves or served lately
// (a typo), once some node connected, is unknown too, with the reason
// (contract.UnmatchedAliasError: 404 naming the targets), not unavailable;
// its queue in Snapshot lists them (QueueSnapshot.UnmatchedTargets), and
// the edge logs a warning per alias with unmatched targets at each reload
// and aliasCheckDelay after it starts serving (catalog.go). Any other
// name is unknown (scheduler.ErrUnknownModel); a known one without a live
// provider has none (scheduler.ErrNoProvider). The request's capability
// needs filter the candidates inside the resolver; NeedChoices, a request
// for several choices, NeedToolChoice (parallel_tool_calls
// false without a forced tool call), NeedRemoteImages (an image by URL),
// NeedPromptBatch (several completions prompts) and NeedTokenInput (token
// ids as a prompt or embeddings input) are met by tunnel-path providers
// only. When they
// reject every candidate, the request is unavailable for now
// (scheduler.ErrProviderUnavailable, HTTP 503 with Retry-After) if a
// provider the edge knows could meet them: one of a current connection
// that is unhealthy, out of rotation or already tried for the request, or
// one of a gone node (it may come back). Only a request that no live or
// configured provider can meet is rejected (scheduler.ErrCandidatesRejected,
// HTTP 400, naming the capability). A queued request whose providers went
// away (node killed or fenced, provider removed from a reconnect Hello,
// circuit open) fails with scheduler.ErrProviderUnavailable, never with a
// rejection (package scheduler, "Re-resolution").
//
// Capabilities are per served model: a model its node described
// (Provider.model_capabilities, e.g. from Ollama's /api/show) has exactly
// its own, any other its provider's; a provider's candidate is the first
// target, in alias order, whose capabilities meet the needs. A chat or
// completion request also needs NeedCompletion, which a model with its own
// capabilities has only when they list it (an embedding model does not).
//
// # Provider updates
//
// A ProviderUpdate changes a provider's health, capacity and, with
// models_set, its served models and what the node says of them
// (capabilities, details): the served-name index, /v1/models, /api/tags and
// /api/show follow at once. A change of health or served models
// re-activates the node's resources in the scheduler, so queued requests
// re-resolve (a waiter left with no live provider fails
// ErrProviderUnavailable); an unhealthy provider is no candidate until an
// update says it is healthy again. An invalid update (unknown provider,
// negative capacity, an empty model name, a healthy provider with no model)
// changes nothing.
//
// Residency (residency.go): the models a provider's node read loaded
// (Provider.loaded, ProviderUpdate.loaded_set), mapped to served names,
// and its max_loaded_models go to the scheduler (SetLoaded) at the Hello
// and at each update that changes them; a run the scheduler granted with
// a load reports its delay to its first answer (ObserveLoad). The
// scheduler's residency policy is Config.Residency (reloadable).
//
// # Runs
//
// Service.Dispatch admits a request, sends Dispatch on the selected
// generation's control stream only (or down an idle warm stream of that
// generation, below) (if that generation was replaced, the
// lease is released and the request admitted once more), and waits, up to
// Config.DispatchTimeout, for the node to open the run's own Run stream with
// RunOpen naming the run and the same generation; any other RunOpen is
// refused with a gRPC status. A body of at most 64 KiB goes in the Dispatch
// message itself (body_inline), so the node calls its provider without
// waiting for the edge; the Run handler sends a larger body down the run
// stream in Body chunks, and then blocks until the run ends; the caller of Run.Recv reads the stream
// directly, so each run is flow-controlled on its own. A node ends a run by
// sending its terminal message and reading until the edge ends the stream;
// cancelling the Run stream aborts the run (ErrNodeGone).
//
// Warm streams (warm.go): a node keeps a few Run streams open ahead of
// need, each opened with RunOpen{idle} naming its node and generation. One
// that does not name the node's current connection is refused
// (FailedPrecondition), as is one of a draining connection; an accepted
// one waits in its connection's idle list (NodeSnapshot.IdleRunStreams).
// A dispatch to a connection with an idle stream takes one and sends the
// Dispatch down it (RunDown.dispatch) instead of on the control stream:
// the run is open once it is sent (RunStarted; no RunOpen to wait for, so
// no dispatch timeout), and goes on as any run. The node acknowledges
// each run on a warm stream with RunOpen naming it, and Run.recv drops
// whatever comes before that (awaitAck), so no message of the stream's
// earlier run is ever read as this one's. A run that ends cleanly (recv
// read its complete event or clean tunnel end, and nothing cancelled it
// first: Run.reusable) gives its stream back to the idle list, up to
// maxIdleStreams (64) per connection, for the next dispatch; one per run
// at a time keeps HTTP/2 flow control per run. Any other end (cancel,
// client gone, an error, a failed stream) ends the stream, as a run's own.
// A node that refuses a Dispatch on a warm stream
// says so on the stream (RunUp.refused), which ends the run as a
// control-stream DispatchRefused does: with MaxRetries above 0 the
// read-ahead sees it and the request is admitted again (a dispatch that
// never reached a provider); with none the run was already handed out,
// and its Recv returns ErrDispatchRefused. A connection without an idle
// stream gets the Dispatch on its control stream, as before. A
// connection's idle streams end when it drains or closes (fenced,
// superseded) and when the edge stops.
//
// Each message a node sends up a run is decoded once, when Run.recv reads
// it (decodeRunUp, decode.go): into the contract's typed message
// (contract.Message: head, data, delta with text, thinking and tool-call
// parts, usage, end, failure) that Recv hands on, with what the edge reads
// of it (whether it ends the run and why, what it says of the provider for
// the circuit breaker and the retry). Run.recv is the one place where the
// end of a run is detected and its lease released; the messages Dispatch
// reads ahead are kept decoded and handed on without decoding them again.
// The HTTP API renders typed messages and never sees the wire protocol.
//
// # Lifecycle events
//
// Deps.Observer, when set, is told of node connections and fences (with
// their generation), each run's queueing, admission, start and end (with
// its provider's in-flight count and its model's queue length right after),
// and dispatch retries (package lifecycle). It is called with no edge lock
// held, on the goroutine where the event happened. A run's end (RunEnded)
// is published once, when the run has ended and its caller closed it with
// the outcome of the request it served (Run.Close), which the caller
// decides after the run ended (after its answer was written); an attempt
// Dispatch drops to admit the request again is published without an
// outcome when Dispatch drops it.
//
// # Queues
//
// Snapshot lists a queue for every model group the scheduler holds, every
// configured alias and every known model name a request asked for
// (Service.requested; only names the catalog knows, so clients cannot
// grow it), each with its policy and queued count.
//
// # Retries and circuit breakers
//
// With Config.MaxRetries above 0, Dispatch also reads the run's first
// messages until one says how the provider did, and keeps them for Recv.
// A provider that failed before the first byte in a way another may not
// (unreachable, 502, 503, 429), or a node lost before the run's first
// message, gives the request to another candidate, never one already
// tried, up to MaxRetries times; the caller sees one run. A request admitted
// again that finds no other candidate (none left, or none left with its
// needs: its capable provider went away) gets the failed attempt's outcome:
// the provider's answer, or for a lost node ErrProviderUnavailable, never a
// rejection. An attempt whose node connection was lost (connLost) leaves
// out that generation only; when it was the last candidate, the request
// waits for the node within reconnect_grace (the resolver says its
// providers are away), even before the edge has fenced the connection.
//
// Dispatch is one loop (dispatch.go): each attempt (Service.attempt: one
// admission, one dispatch, and with MaxRetries above 0 the read-ahead)
// returns an attemptResult (not admitted, out of rotation, not dispatched,
// answered, failed before the first byte, client gone); the pure function
// next(result, state) decides, from it and what earlier attempts left
// (dispatchState: retries counted, whether a dispatch was admitted again,
// out-of-rotation races, the failed attempt to relay), whether to retry on
// a provider not tried yet, admit again or finish, and with what. A
// dispatch that never reached a provider (stale generation, dispatch
// timeout, refused, its node gone or draining before the run opened) is
// admitted again once and counts no retry; a provider out of rotation
// between admission and dispatch is no attempt. The messages read ahead
// belong to the run's readAhead (Run.readFirst fills it, Run.recv returns
// them first). Every
// (node id, provider id) has a circuit breaker (breakers): failures before
// the first byte in a row open it, taking the provider out of the
// resolver's candidates for a cool-down, after which one trial request at a
// time may go to it. Each change of rotation (the circuit opens, its
// cool-down ends on the edge's clock, a trial ends without failing)
// re-activates the node's resources in the scheduler, so queued requests
// re-resolve: a half-open provider's trial slot goes to the earliest waiter
// that can use it, never idle beside it. Its state outlives the node's
// generations, and is forgotten with the node, ForgetAfter after it went.
//
// # Concurrency
//
// No edge lock is taken inside a scheduler callback. The resolvers and
// the ownership checks the scheduler calls under its lock
// (Service.resolver, with catalog.resolve and catalog.couldMeet,
// breakers.inRotation, registry.isCurrent) read published, immutable state
// and take no lock, so the scheduler's lock is the only one held while
// they run, and the lock chain scheduler → registry → breakers is gone
// (issue 16).
//
// The registry publishes its state (every current connection with its
// providers as they stand and its draining flag, the served-name index,
// the gone nodes whose providers still count as configured, the model
// names remembered as unserved) as one regState behind an atomic.Pointer.
// Its writers (add at a connect, remove at a fence, update at a
// ProviderUpdate, drain, forget) take registry.mu, which only serializes
// them, build the next state copy-on-write (cowMap: a write copies the
// shard it changes, not the whole map) and publish it before they let go
// of it; a published state, and every provider and connection state in
// it, is never modified. Every reader (the resolvers, the catalog,
// Snapshot, ModelInfo, the service's lookups) loads the pointer once and
// takes no lock. Nothing outside registry.go takes registry.mu, and
// nothing but the edge's clock is called while it is held. The circuit breakers publish their
// open and half-open circuits the same way (breakers.out): inRotation,
// state and coolDownLeft take no lock; breakers.mu only serializes the
// writers (acquire, record, forgetNode) and is never taken under the
// scheduler's lock or any other.
//
// So every edge lock is a leaf: no call goes out while one is held (but
// to the clock), and no other lock is taken under it. They are registry.mu and breakers.mu
// (above), clusterMode.mu (several edges, cluster.go: the leader's term and
// held leases, the follower's view of its leaders, key permits;
// grpcPeers.mu guards the admission clients; the election
// publishes its state through an atomic pointer), Run.mu, Service.mu (the runs map), Service.statsMu (retry and
// circuit counters, the requested model names), conn.mu (a connection's
// outbox, closed flag, last-seen time, idle warm streams, ShowRequests
// awaiting their ShowAnswer parts: show.go, failed when it closes), trust.mu (node id → token
// bindings), peerAuth.mu (cluster_auth.go: when each refused peer was last
// logged; the key slots a leader adopts are taken and given back with
// clusterMode.mu released, cluster_keys.go) and prefixIndex.mu (the prefix index of prefix-cache-aware
// routing: taken by match before Admit and by record after it, never
// under the scheduler's lock; the Affinity the scheduler calls reads the
// map match returned, which nothing modifies). The one exception is reload.mu, which serializes Reload and
// is held while it sets the scheduler's policies and wakes the registry's
// watchers (registry.notify takes registry.mu); nothing takes reload.mu
// under another lock. The edge calls the scheduler with no other lock of
// its own held. Forgetting gone nodes (Service.forgetGone) takes
// registry.mu, then breakers.mu, one after the other, on the goroutine of
// the connect or disconnect that triggers it.
//
// Run.mu: Run.finish decides the run's end under it, then, with no lock
// held, tells the breaker the outcome (so a circuit this outcome opens
// re-resolves the queued requests before the slot is free), releases the
// lease and closes Run.ended; whoever waits for the end (Recv, Dispatch,
// the Run handler) waits for Run.ended, so finds the slot already free. A
// circuit that opens re-activates its node's resources in the scheduler
// (so queued requests re-resolve) from whoever saw the failure, with no
// lock held; it is published before, so the re-resolution sees it.
//
// Goroutines: each Connect handler is the sole sender on its control stream
// and the sole writer of its connection's lifecycle; one reader goroutine
// per connection is the sole caller of its Recv and hands messages to the
// handler. Other goroutines reach a node only through conn.enqueue, which
// never blocks (a backlog over 4096 messages closes the connection). Each
// Run handler is the sole sender on its run stream (a body not sent
// inline, then a Cancel); the caller of Run.Recv is the sole receiver after RunOpen.
// A warm stream's handler waits, sending nothing, in its connection's idle
// list; whoever takes it off the list (a dispatch, conn.takeIdle; the
// connection draining or closing, conn.endIdle; the handler itself when
// its stream or the edge ends, conn.removeIdle) owns it and sends exactly
// one value on its assigned channel. A dispatch that took it is its one
// sender until then (the Dispatch), and hands the run over on assigned;
// from then on the handler is the sole sender, as on any run stream.
// Timers (heartbeats, hello and dispatch timeouts, and every wait of the
// cluster side: leaderWait, rebuildWait, the follower's silence bound, its
// pauses and Release retries) run on the injected clock; their callbacks only signal a channel or end a pending run (which
// may open its provider's circuit, see above). Each Dispatch attempt has one
// client-gone watcher (watchClient, a context.AfterFunc on the caller's
// context) from the run's creation until the attempt returns: it ends the
// run ("client gone"), which ends the waits for the run to open and the
// read-ahead; stopping it waits for a watcher that already fired, so the
// attempt sees the run's end whole. A run handed to the caller has none.
//
// Every run is finalized exactly once, by Run.finish, whichever comes
// first: Recv seeing a terminal message or a stream error, Cancel or Close,
// the dispatch timeout, DispatchRefused (or RunUp.refused on a warm stream), the caller's context while
// dispatching, the end of its connection or of its Run stream, or the
// edge stopping. The state change under Run.mu decides the winner; only
// the winner reports the outcome to the breaker, releases the lease (scheduler.Lease.Release, itself
// idempotent), forgets the run, and sends Cancel when the run did not end
// on the node. Closing Run.ended then lets the Run handler return. Its
// RunEnded event is published exactly once, by Run.settle (from Close, or
// from Dispatch for a dropped attempt): Run.settled, under Run.mu, decides
// it, and only for a run already ended.
package edge
