package scheduler

import "time"

type leaseState uint8

const (
	leaseReserved leaseState = iota
	leaseTracked
	leaseReleased
)

// DispatchInfo describes an admitted request, for the dispatcher and for
// run records.
type DispatchInfo struct {
	RunID      string // set by Track
	NodeID     string
	Generation uint64
	ProviderID string
	Target     string // served model name the request is rewritten to
	Group      string // requested model name
	Long       bool
	// EstimatedInputTokens is the caller's estimate, passed through.
	EstimatedInputTokens int
	QueueReason          QueueReason
	// Wait is the time spent queued (0 for ReasonImmediate).
	Wait time.Duration
	// Load says the provider was not known to hold Target: the run starts
	// with a model load (package doc, "Residency").
	Load bool
}

// Lease is the right to one slot of one provider resource. It goes
// reserved → tracked (Track: run id known) → released, exactly once, by
// whichever comes first: Release, Scheduler.ReleaseRun (a terminal run
// event) or Fence of its node generation (unless KeepOnFence). Every
// release offers the slot to the first waiter in queue order, in any
// group, that can use it.
type Lease struct {
	s     *Scheduler
	res   *resource
	id    uint64
	start time.Time // when it was reserved

	// Guarded by s.mu.
	prev, next *Lease // in res.leases while unreleased
	state      leaseState
	keep       bool // KeepOnFence: a Fence leaves it
	batch      bool // of a batch request: counted in res.batchInFlight
	info       DispatchInfo
	reason     string
}

// ID returns the lease's id, unique within its Scheduler.
func (l *Lease) ID() uint64 { return l.id }

// Candidate returns the candidate the lease reserved.
func (l *Lease) Candidate() Candidate {
	return Candidate{NodeID: l.info.NodeID, Generation: l.info.Generation, ProviderID: l.info.ProviderID, Target: l.info.Target}
}

// Info returns the lease's dispatch information.
func (l *Lease) Info() DispatchInfo {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.info
}

// Track records the run id the lease serves, so Scheduler.ReleaseRun can
// release it on the run's terminal event. It does nothing to a lease that is
// already tracked or released.
func (l *Lease) Track(runID string) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.state != leaseReserved {
		return
	}
	l.state = leaseTracked
	l.info.RunID = runID
	l.s.byRun[runID] = l
}

// Release gives the slot back and offers it to the earliest waiter that can
// use it. Only the first release of a lease, by any path, has an effect; it
// reports whether this call was that one.
func (l *Lease) Release(reason string) bool {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.releaseLocked(l, reason) {
		return false
	}
	s.observeLocked(l)
	s.freedLocked(l.res)
	return true
}

// Released reports whether the lease was released, and why.
func (l *Lease) Released() (bool, string) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.state == leaseReleased, l.reason
}

// leaseList is an intrusive doubly linked list of a resource's unreleased
// leases: O(1) insert and remove, walked only by Fence.
type leaseList struct{ head *Lease }

func (ll *leaseList) push(l *Lease) {
	l.next = ll.head
	if ll.head != nil {
		ll.head.prev = l
	}
	ll.head = l
}

func (ll *leaseList) remove(l *Lease) {
	if l.prev != nil {
		l.prev.next = l.next
	} else {
		ll.head = l.next
	}
	if l.next != nil {
		l.next.prev = l.prev
	}
	l.prev, l.next = nil, nil
}
