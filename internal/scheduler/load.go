package scheduler

// Load returns the counters of one (node, provider) resource and the
// number of waiters of group, in O(1): for events that report a provider's
// load as it changes. ok is false when the resource is unknown; groupQueued
// is 0 for a group never seen.
func (s *Scheduler) Load(nodeID, providerID, group string) (p ProviderSnapshot, groupQueued int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[group]; g != nil {
		groupQueued = g.queued
	}
	r := s.resources[resourceKey{nodeID, providerID}]
	if r == nil {
		return p, groupQueued, false
	}
	status := StatusAvailable
	if r.orphan {
		status = StatusOrphan
	}
	return ProviderSnapshot{
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
	}, groupQueued, true
}

// Policy returns the queue policy of group: its own once it has one (it
// had a waiter), else the one its first waiter would get (the default
// overlaid with the group's override).
func (s *Scheduler) Policy(group string) Policy {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[group]; g != nil {
		return g.policy
	}
	return s.defaults.overlay(s.overrides[group])
}

// SetPolicies replaces the default policy and every per-group override
// (config reload; DESIGN.md "Policy refresh"): each existing group's policy
// becomes the new default overlaid with its new override (a group whose
// override was removed goes back to the default), for later admissions.
// Queued waiters keep their deadlines and in-flight leases are untouched.
// Zero fields of def take DefaultMaxQueue, DefaultQueueTimeout and
// FairnessOff, zero
// fields of an override take def's. It returns an error wrapping ErrInvalid
// (a negative field, an empty group name), changing nothing.
func (s *Scheduler) SetPolicies(def Policy, groups map[string]Policy) error {
	cfg := Config{Default: def, Groups: groups}
	if err := cfg.Validate(); err != nil {
		return err
	}
	overrides := make(map[string]Policy, len(groups))
	for name, p := range groups {
		overrides[name] = p
	}
	defaults := Policy{MaxQueue: DefaultMaxQueue, QueueTimeout: DefaultQueueTimeout, Fairness: FairnessOff}.overlay(def)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.defaults, s.overrides = defaults, overrides
	for name, g := range s.groups {
		g.policy = defaults.overlay(overrides[name])
	}
	return nil
}
