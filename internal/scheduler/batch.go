package scheduler

import (
	"fmt"
	"slices"
	"time"
)

// Batch band defaults (BatchPolicy).
const (
	DefaultBatchHeadroom     = 1
	DefaultBatchMaxQueue     = 4096
	DefaultBatchQueueTimeout = 24 * time.Hour
)

// BatchPolicy is the policy of the batch band (PriorityBatch), one for
// every group. A zero field takes its default.
type BatchPolicy struct {
	// Headroom is how many slots of each provider a batch request leaves
	// free for interactive ones: it takes a slot only if, after it, the
	// provider still has Headroom free slots. At most capacity − 1 counts,
	// so a provider of capacity ≤ Headroom still runs one batch request
	// at a time when nothing else runs. Default DefaultBatchHeadroom (1);
	// negative means none (every free slot).
	Headroom int
	// MaxQueue is the most batch requests that may wait in one group at
	// once, apart from the group's MaxQueue (which bounds its interactive
	// waiters only); default DefaultBatchMaxQueue.
	MaxQueue int
	// QueueTimeout is how long one batch request may wait for a slot;
	// default DefaultBatchQueueTimeout (24h).
	QueueTimeout time.Duration
	// Backoff is how long a slot freed by an interactive request that had
	// waited for it (granted after queueing) stays kept for the next
	// interactive request, beyond Headroom: while k such slots of a
	// provider are kept, a batch request takes one of its slots only if
	// Headroom + k stay free after it. An interactive request taking a slot
	// of the provider uses up one kept slot. Zero (the default) or
	// negative: none.
	Backoff time.Duration
}

func (p BatchPolicy) validate() error {
	if p.MaxQueue < 0 {
		return fmt.Errorf("%w: batch max_queue %d is negative", ErrInvalid, p.MaxQueue)
	}
	if p.QueueTimeout < 0 {
		return fmt.Errorf("%w: batch queue_timeout %s is negative", ErrInvalid, p.QueueTimeout)
	}
	return nil
}

func (p BatchPolicy) withDefaults() BatchPolicy {
	switch {
	case p.Headroom == 0:
		p.Headroom = DefaultBatchHeadroom
	case p.Headroom < 0:
		p.Headroom = 0
	}
	if p.MaxQueue == 0 {
		p.MaxQueue = DefaultBatchMaxQueue
	}
	if p.QueueTimeout == 0 {
		p.QueueTimeout = DefaultBatchQueueTimeout
	}
	p.Backoff = max(p.Backoff, 0)
	return p
}

// SetBatchPolicy replaces the batch band's policy (zero fields: the
// defaults). Queued batch requests keep their deadlines; a smaller
// headroom hands out the slots it frees at once. It returns an error
// wrapping ErrInvalid for a negative MaxQueue or QueueTimeout, changing
// nothing.
func (s *Scheduler) SetBatchPolicy(p BatchPolicy) error {
	if err := p.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batch = p.withDefaults()
	s.pumpAllLocked()
	return nil
}

// BatchPolicy returns the batch band's policy, defaults applied.
func (s *Scheduler) BatchPolicy() BatchPolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batch
}

// headroomLocked is how many of r's slots a batch request leaves free:
// the policy's headroom, at most r's capacity − 1.
func (s *Scheduler) headroomLocked(r *resource) int {
	return max(min(s.batch.Headroom, r.capacity-1), 0)
}

// fitsLocked reports whether req may take one of r's slots now: r has a
// free slot (r.fits), and for a batch request batchRoomLocked.
func (s *Scheduler) fitsLocked(r *resource, req *Request) bool {
	if req.Priority == PriorityBatch {
		return s.batchRoomLocked(r, req.Long)
	}
	return r.fits(req.Long)
}

// batchRoomLocked reports whether a batch request (long or not) may take
// one of r's slots: r has one and keeps its headroom (headroomLocked) and
// the slots kept for interactive requests (reservedLocked) free after it. No
// interactive waiter could use that slot: the pumps hand every free slot
// to the interactive waiters that can use it first (queue order), and nextResidentLocked never passes one for a batch waiter. An
// interactive waiter that chose to wait for a provider holding its model
// (waitHotLocked) rather than load it on r does not hold r back: the
// headroom keeps a slot of r free for it.
func (s *Scheduler) batchRoomLocked(r *resource, long bool) bool {
	return r.fits(long) && r.inFlight+1+s.headroomLocked(r)+s.reservedLocked(r) <= r.capacity
}

// reservedLocked is how many of r's slots are kept for interactive
// requests (keepForInteractiveLocked), dropping those that lapsed.
func (s *Scheduler) reservedLocked(r *resource) int {
	if len(r.reserved) == 0 {
		return 0
	}
	now := s.clock.Now()
	r.reserved = slices.DeleteFunc(r.reserved, func(until time.Time) bool { return !until.After(now) })
	return len(r.reserved)
}

// keepForInteractiveLocked keeps the slot of r that an interactive
// request which had waited just freed for the next interactive request,
// for the batch policy's Backoff at most. Interactive requests that
// waited are granted together as batch lines end, so under a steady load
// they end together one service time later; without this, queued batch
// lines took the slots they freed (the headroom rule alone allows it) and
// held them for their whole runs, the next interactive arrivals waited in
// turn, and the waits came back every service time. Kept slots are taken
// by the next interactive requests (takeReservedLocked), at no cost to the
// batch in a steady state where nothing waits.
func (s *Scheduler) keepForInteractiveLocked(r *resource) {
	if s.batch.Backoff <= 0 || r.capacity < 1 {
		return
	}
	s.reservedLocked(r)
	if len(r.reserved) >= r.capacity {
		r.reserved = slices.Delete(r.reserved, 0, 1)
	}
	r.reserved = append(r.reserved, s.clock.Now().Add(s.batch.Backoff))
	if r.reservedTimer == nil {
		s.armReservedLocked(r)
	}
}

// takeReservedLocked counts an interactive request's slot of r against
// the earliest slot kept for one, if any.
func (s *Scheduler) takeReservedLocked(r *resource) {
	if s.reservedLocked(r) > 0 {
		r.reserved = slices.Delete(r.reserved, 0, 1)
	}
}

// armReservedLocked sets r's timer for the earliest of r.reserved; when
// it fires, the kept slots that lapsed are handed out
// (pumpResourceLocked) and the timer is set for the next one.
func (s *Scheduler) armReservedLocked(r *resource) {
	if len(r.reserved) == 0 {
		r.reservedTimer = nil
		return
	}
	r.reservedTimer = s.clock.AfterFunc(slices.MinFunc(r.reserved, time.Time.Compare).Sub(s.clock.Now()), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.reservedLocked(r)
		s.armReservedLocked(r)
		s.pumpResourceLocked(r)
	})
}

// fullLocked reports whether g's queue of a request of priority p is
// full: its batch waiters against the batch MaxQueue, its interactive
// ones against the group's.
func (s *Scheduler) fullLocked(g *group, p Priority) bool {
	if p == PriorityBatch {
		return g.batchQueued >= s.batch.MaxQueue
	}
	return g.interactive() >= g.policy.MaxQueue
}

// queueTimeoutLocked is how long a request of g of priority p may wait.
func (s *Scheduler) queueTimeoutLocked(g *group, p Priority) time.Duration {
	if p == PriorityBatch {
		return s.batch.QueueTimeout
	}
	return g.policy.QueueTimeout
}
