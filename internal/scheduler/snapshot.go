package scheduler

import "sort"

// Resource statuses in snapshots.
const (
	StatusAvailable = "available"
	StatusOrphan    = "orphan"
)

// ProviderSnapshot is the state of one (node, provider) resource.
type ProviderSnapshot struct {
	NodeID       string
	ProviderID   string
	Generation   uint64
	Capacity     int
	LongCapacity int
	InFlight     int
	LongInFlight int
	// BatchInFlight counts the leases of batch requests (of InFlight).
	BatchInFlight int
	// Queued counts the waiters that list this provider among their candidates.
	Queued int
	// Load is InFlight/Capacity.
	Load   float64
	Status string
}

// GroupSnapshot is the state of one model group.
type GroupSnapshot struct {
	Name   string
	Policy Policy
	// Queued counts its waiters, Batch those of them of the batch band.
	Queued, Batch int
	// Flows counts the group's waiters by flow and priority, sorted by
	// flow then priority (highest first); only pairs with a waiter.
	Flows []FlowSnapshot
}

// FlowSnapshot is the queue of one flow of one group in one priority band.
type FlowSnapshot struct {
	Flow     string
	Priority Priority
	Queued   int
}

// Snapshot is a consistent view of the scheduler, sorted by node then
// provider, and by group name.
type Snapshot struct {
	Providers []ProviderSnapshot
	Groups    []GroupSnapshot
	// Waiters is the number of queued requests; Leases the unreleased leases.
	Waiters int
	Leases  int
}

// Snapshot returns the current counters. It costs O(resources + groups +
// flows with a waiter).
func (s *Scheduler) Snapshot() Snapshot {
	s.mu.Lock()
	snap := Snapshot{
		Providers: make([]ProviderSnapshot, 0, len(s.resources)),
		Groups:    make([]GroupSnapshot, 0, len(s.groups)),
		Waiters:   s.waiters,
		Leases:    s.active,
	}
	for _, r := range s.resources {
		status := StatusAvailable
		if r.orphan {
			status = StatusOrphan
		}
		snap.Providers = append(snap.Providers, ProviderSnapshot{
			NodeID:        r.key.node,
			ProviderID:    r.key.provider,
			Generation:    r.generation,
			Capacity:      r.capacity,
			LongCapacity:  r.longCapacity,
			InFlight:      r.inFlight,
			LongInFlight:  r.longInFlight,
			BatchInFlight: r.batchInFlight,
			Queued:        len(r.short) + len(r.long),
			Load:          float64(r.inFlight) / float64(r.capacity),
			Status:        status,
		})
	}
	for _, g := range s.groups {
		gs := GroupSnapshot{Name: g.name, Policy: g.policy, Queued: g.queued, Batch: g.batchQueued}
		for _, f := range g.flows {
			for band, n := range f.queued {
				if n > 0 {
					gs.Flows = append(gs.Flows, FlowSnapshot{Flow: f.name, Priority: PriorityCritical - Priority(band), Queued: n})
				}
			}
		}
		sort.Slice(gs.Flows, func(i, j int) bool {
			a, b := gs.Flows[i], gs.Flows[j]
			if a.Flow != b.Flow {
				return a.Flow < b.Flow
			}
			return a.Priority > b.Priority
		})
		snap.Groups = append(snap.Groups, gs)
	}
	s.mu.Unlock()
	sort.Slice(snap.Providers, func(i, j int) bool {
		a, b := snap.Providers[i], snap.Providers[j]
		if a.NodeID != b.NodeID {
			return a.NodeID < b.NodeID
		}
		return a.ProviderID < b.ProviderID
	})
	sort.Slice(snap.Groups, func(i, j int) bool { return snap.Groups[i].Name < snap.Groups[j].Name })
	return snap
}
