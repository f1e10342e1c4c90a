// Package scheduler admits requests to provider slots: the heart of iop.
//
// A request names a model group (the requested model name) and brings a
// request-local resolver that returns its live candidates: (node generation,
// provider, served target) triples already filtered by the request's
// predicate. Admit reserves one slot of the least loaded candidate resource
// (lowest in-flight/capacity, ties by provider id then node id; or, with
// Request.Affinity, the free one expected to hold the longest prefix of the
// prompt within Request.AffinitySlack of that load; or Request.Prefer when
// it is free), or queues the
// request in its group until a slot is handed over, the group's queue timeout
// passes, the caller's context ends, or no candidate is left.
//
// A Lease is the right to one slot. It goes reserved → tracked (run id known)
// → released exactly once, by whichever comes first: Lease.Release,
// Scheduler.ReleaseRun (a terminal run event), or Fence (node disconnect;
// not for a lease kept on fence, Lease.KeepOnFence: several edges, the run
// of another edge's connection). Adopt counts a run already in flight that
// an earlier scheduler admitted (a new cluster leader's rebuild).
// Every release offers the slot to the first waiter in queue order, in any
// group, that can use it, so no slot stays idle while a waiter that can use
// it waits.
//
// # Fair order
//
// Queue order is by priority band (critical, standard, sheddable), then a
// waiter's start tag, then enqueue order (seq). Each band of each group
// whose policy has FairnessOn is a start-time fair queue (Goyal, Vin and
// Cheng 1996) between flows (Request.Flow, weighted by Request.Weight): a
// waiter's start tag is max(the band's virtual time, its flow's last
// finish tag) and its flow's finish tag advances by 1/weight; the band's
// virtual time is the largest start tag granted in it. So backlogged flows
// get slots in proportion to their weights (within 1/w_a + 1/w_b of it over
// any interval, TestFairModel), FIFO within a flow. A band that had no
// waiter starts at the largest virtual time, in that band, of the
// resources its waiter can use, so the tags of groups sharing a provider
// compare: a newly busy group neither jumps ahead of another's waiters
// there nor waits behind its whole queue. A group with FairnessOff tags
// every waiter 0: FIFO within each band, and, where every group is off,
// exactly the global enqueue order of a scheduler without flows. A flow
// lives while it has a waiter (the flows are bounded by the queue); a
// waiter that leaves without a slot from its flow's tail gives its cost
// back.
//
// # Priorities and shedding
//
// At a full queue (max_queue), an arrival that is not sheddable displaces
// the group's latest sheddable waiter (ErrShed, ErrDisplaced); else, in a
// fair group, an arrival of a flow holding less of the queue for its
// weight than the flow holding the most pushes that flow's latest waiter
// of the arrival's band or lower out (ErrQueueFull: longest-queue drop);
// else the arrival is refused (ErrQueueFull). A sheddable arrival that
// would queue is refused at once (ErrShed, ErrExpectedWait) when its
// expected wait, (queued + 1) × the group's mean lease time (an
// exponentially weighted average over about 8 leases released by Release
// or ReleaseRun) / the total capacity of its candidates, passes the
// group's queue timeout. Every shed or pushed-out waiter is settled once,
// under the lock, holding no slot.
//
// # Work conservation
//
// Each resource keeps the waiters that list it in a heap in queue order
// (short and long-context apart). A waiter is in resource r's heap only while
// one of its candidates is live on r: r is not orphan and belongs to the
// candidate's generation. So when r has a free slot, the top of its heap can
// always take it (on r, or on a less loaded candidate of its own), and a
// release hands its slot over in O(log W) without passing over anyone. Every
// path that frees a slot or makes one usable hands it out before it returns:
// a release and a capacity change pump the resource, an Activate or a Fence
// re-resolves every waiter and then walks them all in queue order (the
// global list, sorted by queue order when some waiter is tagged or not
// standard: O(W log W), at those rare events only). A fresh
// admission takes a free slot only when no queued waiter can use it.
//
// # Residency
//
// With Config.Residency (or SetResidencyPolicy) a load is a cost. The
// scheduler believes a provider holds what SetLoaded last read (its node's
// /api/ps) plus the loads its grants started since (a cold grant evicts
// the least recently used model beyond the limit: configured, else the
// most read loaded at once). A provider never read holds every model.
//   - Among free candidates, one holding its target wins (Prefer and the
//     chooser decide among those); DispatchInfo.Load marks a cold grant.
//   - With none free, a request waits for a busy holder whose queue takes
//     less than a load, for at most min(load time, MaxExtraWait); then it
//     takes any free slot.
//   - A load goes where it evicts nothing, else where the LRU model has no
//     run in flight and no waiter listing the provider asks for it.
//   - A release hands its slot to the first waiter, in queue order, that
//     needs no load there or has waited MaxExtraWait, before an earlier one
//     that needs a swap (batch by model, an elevator with a deadline); with
//     neither, to the first waiter as always. So no slot stays idle while a
//     waiter that could use it without a load waits.
//
// Capacity, leases and queue admission are untouched. A release under the
// policy costs O(waiters listing the resource) to find that waiter.
//
// # Re-resolution
//
// Activate and a Fence that changed something call every waiter's resolver
// again, in enqueue order:
//   - candidates: the waiter lists the live ones; none live fails it with
//     ErrProviderUnavailable (after the reconnect grace, below);
//   - ErrUnknownModel, ErrNoProvider, ErrCandidatesRejected,
//     ErrProviderUnavailable: the providers that could serve it went away (it
//     had a live candidate meeting its predicate when it was queued), so it
//     fails with ErrProviderUnavailable, never with ErrCandidatesRejected,
//     which is kept for a request no provider can take when it arrives;
//   - any other error (a fault of the resolver): the waiter stays queued with
//     those of its candidates that are still live, possibly none, and is
//     "stale". Stale waiters are re-resolved, in enqueue order, at every
//     later admission (before the new request is considered), effective
//     release and capacity change, and are then offered free slots, so one
//     whose resolver recovered is served before any later request. A stale
//     waiter that never recovers waits until its queue timeout.
//
// A waiter whose every candidate went away fails at once only without a
// reconnect grace (Policy.ReconnectGrace). With one it stays queued, with
// no candidate and stale, until a re-resolution finds a candidate (a node
// back after its restart) or its grace (the injected clock) or queue
// timeout ends, whichever first.
//
// # Bounded state
//
// A resource that is orphan (its connection fenced, or dropped from the
// node's newer Hello), has no lease and is listed by no waiter is forgotten:
// at the fence, at the Activate that orphans it, or at its last lease's
// release. A node without resources is forgotten with them, generation
// included (after that, only Activate's ownership check tells a late
// activation of an old generation). Groups stay once created, with their
// policy and queue counter: one per model name that has queued.
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
// O(candidates) for the waiter it hands the slot to, fair or not. An
// arrival at a full fair queue that finds no sheddable waiter costs
// O(flows of its group) more (the longest-queue drop). Fence and Activate
// re-resolve every waiter: O(waiters × candidates); they are rare. While S
// waiters are stale (their resolver failing), an admission, release or
// capacity change also costs O(S × candidates); with none, nothing.
//
// # Concurrency
//
// One mutex, Scheduler.mu, guards all state: resources, groups, waiters and
// leases. Every exported method takes it; nothing runs under it but the
// scheduler's own bookkeeping and the resolvers and ownership callbacks
// supplied by the caller, which must not call back into the scheduler and
// should not block: a lock one takes would nest under the scheduler's, so
// it must be a leaf the caller never holds while calling the scheduler.
// The edge's take none: they read state it publishes immutably (package
// edge, "Concurrency").
//
// Admit blocks in its caller's goroutine, outside the lock, on a one-slot
// channel. The lock holder that settles a waiter (grant, timeout, failure)
// sends exactly one result on it and marks the waiter settled; an Admit whose
// context ends first removes the waiter under the lock, or, if it was settled
// in the same instant, takes the result and releases a granted lease, so a
// slot is never lost. Queue timeouts are timers of the injected Clock whose
// callbacks take the lock; the scheduler starts no goroutines of its own.
package scheduler
