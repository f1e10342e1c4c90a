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
	// Backoff is how long an interactive request that had to wait for a
	// provider (granted a slot after queueing) keeps one more of its slots
	// from batch requests, beyond Headroom: after k such waits within
	// Backoff, a batch request takes a slot only if Headroom + min(k,
	// max(Headroom, 1)) stay free after it — the headroom at most doubles
	// while interactive requests wait. Zero (the default) or negative:
	// none.
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
// one slot per recent interactive wait (waitedLocked) free after it. No
// interactive waiter could use that slot: the pumps hand every free slot
// to the interactive waiters that can use it first (queue order), and nextResidentLocked never passes one for a batch waiter. An
// interactive waiter that chose to wait for a provider holding its model
// (waitHotLocked) rather than load it on r does not hold r back: the
// headroom keeps a slot of r free for it.
func (s *Scheduler) batchRoomLocked(r *resource, long bool) bool {
	h := s.headroomLocked(r)
	return r.fits(long) && r.inFlight+1+h+min(s.waitedLocked(r), max(h, 1)) <= r.capacity
}

// waitedLocked is how many interactive requests waited for r within the
// batch policy's Backoff (pruning the older ones): r keeps that many more
// slots from batch requests, beyond its headroom, up to the headroom again
// (at least one): batchRoomLocked.
func (s *Scheduler) waitedLocked(r *resource) int {
	if len(r.waited) == 0 {
		return 0
	}
	now := s.clock.Now()
	r.waited = slices.DeleteFunc(r.waited, func(until time.Time) bool { return !until.After(now) })
	return len(r.waited)
}

// yieldLocked counts a wait of an interactive request granted a slot
// after queueing on each resource of cands (those it listed and waited
// for), for the batch policy's Backoff. Under a steady interactive load
// the requests that waited end together; without it, batch lines took
// the slots they freed (the headroom rule alone allows it) and held them
// for their runs, the next interactive arrivals waited in turn, and the
// waits came back every service time. An occasional wait holds back one
// slot for Backoff; a burst of them, as many as the headroom again. A
// timer hands the slots out (pumpResourceLocked) when a wait stops
// counting.
func (s *Scheduler) yieldLocked(cands []choice) {
	if s.batch.Backoff <= 0 {
		return
	}
	until := s.clock.Now().Add(s.batch.Backoff)
	for _, c := range cands {
		r := c.res
		if r == nil || r.capacity < 1 {
			continue
		}
		s.waitedLocked(r)
		if len(r.waited) >= r.capacity {
			r.waited = slices.Delete(r.waited, 0, 1) // the earliest: each one counts Backoff from its grant
		}
		r.waited = append(r.waited, until)
		// Armed again: this wait may end before the one the timer was
		// set for (a shorter Backoff since, or that one dropped above).
		s.armWaitedLocked(r)
	}
}

// armWaitedLocked sets r's timer for the earliest of r.waited, replacing
// the one set before; when it fires, the waits that passed stop counting,
// r's free slots are handed out, and the timer is set again for the next
// one.
func (s *Scheduler) armWaitedLocked(r *resource) {
	if r.waitedTimer != nil {
		r.waitedTimer.Stop()
	}
	r.waitedArm++
	if len(r.waited) == 0 {
		r.waitedTimer = nil
		return
	}
	arm := r.waitedArm
	r.waitedTimer = s.clock.AfterFunc(slices.MinFunc(r.waited, time.Time.Compare).Sub(s.clock.Now()), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if r.waitedArm != arm {
			return // replaced while it fired
		}
		s.waitedLocked(r)
		s.armWaitedLocked(r)
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
