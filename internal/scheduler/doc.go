// Package scheduler admits requests to provider slots: the heart of iop.
// It is pure logic driven by calls and an injected Clock: no network, no
// goroutines of its own. The semantics are DESIGN.md's ("The scheduler");
// docs/scheduling.md says them for operators.
//
// A request names a model group (the requested model name) and brings a
// resolver returning its live candidates: (node generation, provider,
// served target), already filtered by the request's predicate. Admit
// reserves a slot of the best free candidate (pick: least loaded, or by
// Request.Affinity or Request.Prefer) or queues the request in its group.
// A Lease is the right to one slot: reserved → tracked → released, once.
//
// # What lives where
//
//   - scheduler.go: Scheduler, Admit (enqueue), release, Activate, Fence,
//     SetCapacity, UpdatePolicy; the pumps and the re-resolution.
//   - lease.go: Lease (Track, Release) and DispatchInfo.
//   - fair.go: priority bands, start-time fair queueing between flows
//     (fairTagLocked), shedding (pushOutLocked, expectedWaitLocked).
//   - batch.go: the batch band's policy and room (BatchPolicy,
//     batchRoomLocked): headroom, its own queue bound and timeout.
//   - heap.go: the per-resource waiter heaps in queue order.
//   - residency.go: model residency, a load as a cost (ResidencyPolicy,
//     SetLoaded, ObserveLoad; pickResidentLocked, nextResidentLocked).
//   - cluster.go: Adopt and KeepOnFence, for a cluster leader's rebuild.
//   - load.go, snapshot.go: views (Load, Policy, Snapshot); clock.go; errors.go.
//
// # Invariants
//
//   - No admission exceeds a resource's capacity (long ones too); one
//     over capacity (lowered, or Adopt) admits nothing until under it.
//   - A lease is released exactly once; releasing it again is a no-op.
//   - Work conservation: no slot stays free while a waiter that can use it
//     waits (every path that frees or adds a slot pumps before returning).
//   - A waiter is in resource r's heap only while a candidate is live on r.
//   - A slot handed over in the instant of a timeout or cancel is released.
//   - A waiter whose providers went away fails ErrProviderUnavailable,
//     never ErrCandidatesRejected (resolveLocked).
//   - A stale waiter (its resolver failing) is re-resolved before any
//     later request is considered (retryStaleLocked).
//   - An orphan resource with no lease and no waiter is forgotten
//     (dropIfDrainedLocked); a group stays once created (groupLocked).
//   - Counters are kept incrementally; nothing scans every lease or waiter
//     on the hot path.
//
// # Residency
//
// With Config.Residency (or SetResidencyPolicy) a load is a cost. A
// provider holds what SetLoaded last read plus the loads its grants
// started since (touchLocked); one never read holds every model.
//
//   - A free candidate holding its target wins (pickResidentLocked).
//   - A request may wait for a busy holder, at most the shorter of the
//     load time and MaxExtraWait (waitHotLocked).
//   - A load goes where it evicts nothing idle (evictionCostLocked).
//   - A load evicts no model running or in more demand than its own until
//     its request waited MaxExtraWait (evictBusy, evictInDemand).
//   - A kept model (SetKept) is evicted last, and a load avoids providers
//     where it would evict one (victimLocked, evictWanted).
//   - A freed slot goes to the first waiter needing no load there, or
//     overdue, before an earlier one needing a swap (nextResidentLocked).
//   - No slot stays idle while a waiter that could use it without a load
//     waits; one needing a load waits beside it only for a busy holder
//     or while its load would evict a model, bounded as above.
//
// # Queue order
//
// By priority band, then start tag (fairTagLocked; 0 unless fair), then
// enqueue order (waiter.before): with fairness off, the enqueue order.
// PriorityBatch, last, is a band like the others (fair by flow when fair).
// A batch waiter takes a slot only if no interactive waiter can use it
// (grantEachLocked; nextResidentLocked never passes one) and
// min(headroom, capacity−1) of its provider's slots stay free; it is
// never displaced nor pushed out, nor counted in MaxQueue (flow.total).
//
// # Cost
//
// Admit: O(candidates). Snapshot: O(resources + groups). A release:
// O(log W) for W waiters listing the resource, plus O(candidates) for the
// waiter that gets it (O(W) under a residency policy). A full fair queue:
// O(flows) more. Fence and Activate: O(waiters × candidates). S stale
// waiters add O(S × candidates) to each admission, release and capacity
// change.
//
// # Concurrency
//
// One mutex, Scheduler.mu, guards all state: resources, groups, waiters
// and leases. Every exported method takes it. Under it run only the
// scheduler's own bookkeeping and the caller's resolvers and ownership
// callbacks. Those must not call the scheduler and should not block; a
// lock they take nests under Scheduler.mu, so it must be a leaf the caller
// never holds while calling the scheduler.
//
// Admit blocks in its caller's goroutine, outside the lock, on a one-slot
// channel. Whoever settles a waiter (grant, timeout, failure) does it under
// the lock, sends exactly one result and marks it settled. An Admit whose
// context ends first removes its waiter (abandon), or takes a result
// settled in the same instant and releases a granted lease. Queue timeouts
// are timers of the injected Clock; their callbacks take the lock.
package scheduler
