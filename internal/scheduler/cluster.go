package scheduler

import "fmt"

// Several edges (package cluster): the elected leader's scheduler counts
// the leases of every edge. Two additions serve it; a single edge uses
// neither.

// KeepOnFence marks the lease as serving a run that another edge
// dispatched over its own connection to the node: a Fence of this
// scheduler's connection to the node no longer releases it (the run goes
// on over the other edge's connection), only Release, ReleaseRun or the
// caller's reconciliation does. Its resource stays counted, orphan if the
// connection went, until the lease is released. It does nothing to a
// released lease.
func (l *Lease) KeepOnFence() {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if l.state != leaseReleased {
		l.keep = true
	}
}

// Adopt reserves a slot of (nodeID, providerID) for a run already in
// flight that an earlier leader admitted (a new leader's rebuild from the
// nodes' reports): unconditionally, even above capacity (the resource then
// admits nothing until it drains under it) or on a resource this
// scheduler has not activated (it is held orphan, with its counters, until
// the node's Activate). The lease is tracked under runID (when not empty)
// and kept on fence (KeepOnFence). An empty node or provider id returns an
// error wrapping ErrInvalid.
func (s *Scheduler) Adopt(nodeID, providerID, target, group string, long bool, runID string) (*Lease, error) {
	if nodeID == "" || providerID == "" {
		return nil, fmt.Errorf("%w: adopt: empty node or provider id", ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := resourceKey{nodeID, providerID}
	r := s.resources[key]
	if r == nil {
		r = &resource{key: key, capacity: 1, longCapacity: 1, orphan: true}
		s.resources[key] = r
		byProvider := s.nodes[nodeID]
		if byProvider == nil {
			byProvider = make(map[string]*resource)
			s.nodes[nodeID] = byProvider
		}
		byProvider[providerID] = r
	}
	l := s.reserveLocked(r, Candidate{NodeID: nodeID, Generation: r.generation, ProviderID: providerID, Target: target},
		Request{Group: group, Long: long}, ReasonImmediate, 0)
	l.keep = true
	if runID != "" {
		l.state = leaseTracked
		l.info.RunID = runID
		s.byRun[runID] = l
	}
	return l, nil
}
