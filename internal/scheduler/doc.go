// Package scheduler admits requests to provider slots: the heart of iop.
//
// A request names a model group (the requested model name) and brings a
// request-local resolver that returns its live candidates: (node generation,
// provider, served target) triples already filtered by the request's
// predicate. Admit reserves one slot of the least loaded candidate resource
// (lowest in-flight/capacity, ties by provider id then node id), or queues the
// request in its group until a slot is handed over, the group's queue timeout
// passes, the caller's context ends, or no candidate is left.
//
// A Lease is the right to one slot. It goes reserved → tracked (run id known)
// → released exactly once, by whichever comes first: Lease.Release,
// Scheduler.ReleaseRun (a terminal run event), or Fence (node disconnect).
// Every release offers the slot to the earliest waiter, in any group, that can
// use it, so no slot stays idle while a waiter that can use it waits.
//
// The semantics are those of DESIGN.md ("The scheduler") and of the earlier
// system's queue manager (shared/seeds 000 and 001); the shape is new: one
// Lease type instead of "node:provider" slot keys, per-resource waiter heaps
// instead of scans, counters kept incrementally.
//
// # Cost
//
// Admit and Snapshot cost O(candidates) (Snapshot O(resources + groups)). A
// release costs O(log W) for W waiters listing the released resource, plus
// O(candidates) for the waiter it hands the slot to. Fence and Activate
// re-resolve every waiter: O(waiters × candidates); they are rare.
//
// # Concurrency
//
// One mutex, Scheduler.mu, guards all state: resources, groups, waiters and
// leases. Every exported method takes it; nothing blocks while holding it
// except the resolvers and ownership callbacks supplied by the caller, which
// run under it and must not call back into the scheduler (they may take the
// caller's own locks: the lock order is scheduler, then caller).
//
// Admit blocks in its caller's goroutine, outside the lock, on a one-slot
// channel. The lock holder that settles a waiter (grant, timeout, failure)
// sends exactly one result on it and marks the waiter settled; an Admit whose
// context ends first removes the waiter under the lock, or, if it was settled
// in the same instant, takes the result and releases a granted lease, so a
// slot is never lost. Queue timeouts are timers of the injected Clock whose
// callbacks take the lock; the scheduler starts no goroutines of its own.
package scheduler
