// Package edge is the edge's core: the node registry, the model catalog,
// the gRPC NodeGateway endpoint nodes dial, and the dispatch Service that
// the HTTP API (package edge/api) calls. The scheduler (package scheduler)
// decides admission; this package feeds it candidates and node lifecycle,
// carries admitted requests to nodes and carries their answers back.
// docs/architecture.md places it among the other packages.
//
// # What lives where
//
//   - server.go: NewServer wires Config and Deps; Server.Serve serves nodes.
//   - grpc.go: the Connect and Run handlers; accept checks a Hello,
//     closeConn fences a connection, forgetGone drops old state.
//   - registry.go: connections, generations, providers (parseHello,
//     registry.add/remove/drain/update); its state is published read-only.
//   - trust.go: node join tokens; a node id stays bound to its first token.
//   - catalog.go: a model name → candidates (catalog.resolve, couldMeet).
//   - service.go: Service.Dispatch, Snapshot, the requested-model list.
//   - dispatch.go: the dispatch loop; the pure function next holds its rules.
//   - run.go, readahead.go, decode.go: one Run; decodeRunUp decodes each
//     node message once; Run.finish ends a run once.
//   - warm.go: Run streams a node opens ahead of need (warmStream).
//   - breaker.go: a circuit breaker per (node, provider).
//   - residency.go: the models providers hold loaded, to the scheduler
//     (syncResidency: SetLoaded) and to the API (Loaded); a cold run's
//     delay to its first answer is its load cost (ObserveLoad).
//   - admission.go, cluster*.go: localAdmission on one edge, clusterMode
//     (etcd election, peer edges) for several (docs/several-edges.md).
//   - errors.go: sentinel errors; boundaryError maps the scheduler's errors
//     to the contract's once, where Dispatch returns.
//   - package edge/contract: what the HTTP API asks and gets back.
//
// # Invariants
//
//   - Each accepted connection gets a generation above every earlier one.
//   - A fenced generation's leases are released and its runs end ErrNodeGone.
//   - A refused Hello leaves the node's current connection untouched.
//   - Dispatch sends only on the generation the scheduler selected.
//   - Every run ends exactly once (Run.finish) and releases its lease once.
//   - A run's RunEnded event is published exactly once (Run.settle).
//   - Each run has its own Run stream, so HTTP/2 flow control is per run.
//   - A client's cancel never counts against a provider's circuit.
//   - The HTTP API sees typed contract messages, never the wire protocol.
//
// # Concurrency
//
// Every edge lock is a leaf: no call goes out while one is held (but to
// the clock), and no other lock is taken under it. The locks:
//
//   - registry.mu serializes the registry's writers; readers load the
//     published regState (atomic.Pointer, copy-on-write cowMap) lock-free.
//   - breakers.mu serializes breaker writers; breakers.out is published.
//   - Service.mu guards the runs map; Service.statsMu the counters and
//     the requested model names.
//   - Run.mu guards one run's state; conn.mu one connection's outbox,
//     closed flag, last-seen time, idle warm streams and pending shows.
//   - trust.mu, peerAuth.mu, clusterMode.mu and qmu, grpcPeers.mu,
//     prefixIndex.mu: their own maps (see each type).
//   - keepState.mu guards keep_loaded's aliases and its pending and
//     failed loads; conn.mu also the pending ResidencyRequests.
//   - reload.mu serializes Reload, the one lock held across calls (the
//     scheduler's policies, registry.notify); only keepState.mu is taken
//     under it (setKept).
//
// The scheduler calls the resolvers and ownership checks under its own
// lock (Service.resolver, catalog.resolve, breakers.inRotation,
// registry.isCurrent): they read published state and take no lock. The
// edge calls the scheduler with no lock of its own held.
//
// Goroutines:
//
//   - Each Connect handler is the sole sender on its control stream and
//     the sole writer of its connection's lifecycle; one reader goroutine
//     per connection is the sole caller of its Recv.
//   - Others reach a node only through conn.enqueue, which never blocks.
//   - Each Run handler is the sole sender on its run stream; the caller of
//     Run.Recv is its sole receiver after RunOpen.
//   - A warm stream's owner is whoever took it off the idle list; it sends
//     exactly one value on warmStream.assigned.
//   - Timers run on the injected clock; their callbacks only signal a
//     channel or end a pending run.
//   - Each Dispatch attempt has one client-gone watcher (watchClient).
//   - One keeper goroutine per Serve (keepLoaded) makes keep_loaded's
//     passes; one goroutine per load it asks for (keepState.wg), which
//     Serve waits for before it returns.
package edge
