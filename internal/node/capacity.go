package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Node-wide capacity: the runs of every connection (every edge) share
// each provider's slots, so a provider never runs more than its capacity
// at once whatever the edges send (with several edges that do not count
// together, each may think the provider free).

// ErrProviderBusy: the Dispatch's provider already runs its capacity on
// this node (the edges together sent more than it takes).
var ErrProviderBusy = errors.New("provider at capacity on this node")

// slotWait is how long a Dispatch whose provider is full waits for a
// slot before it is refused with ErrProviderBusy. An edge that counts
// alone frees its slot of a run as it reads the run's end or cancels it,
// a moment before the node's run is over: the short wait absorbs that
// race, so such an edge is never refused for load.
const slotWait = time.Second

// RunInFlight describes one run the node has in flight, on any
// connection.
type RunInFlight struct {
	// RunID is the run's id, given by the edge that dispatched it.
	RunID string
	// Edge is the address of the edge connection it came on (as in
	// Generations).
	Edge string
	// Generation is that connection's generation.
	Generation uint64
	// ProviderID is the provider that runs it.
	ProviderID string
}

// RunsInFlight lists every run the node has in flight, on every
// connection, sorted by edge then run id (a run holding a provider slot or
// waiting for one).
func (a *Agent) RunsInFlight() []RunInFlight {
	a.slotMu.Lock()
	out := make([]RunInFlight, 0, len(a.inFlight))
	for r := range a.inFlight {
		out = append(out, RunInFlight{RunID: r.id, Edge: r.edge, Generation: r.gen, ProviderID: r.provider})
	}
	a.slotMu.Unlock()
	slices.SortFunc(out, func(x, y RunInFlight) int {
		if c := strings.Compare(x.Edge, y.Edge); c != 0 {
			return c
		}
		return strings.Compare(x.RunID, y.RunID)
	})
	return out
}

// track adds r to the node's runs in flight.
func (a *Agent) track(r *run) {
	a.slotMu.Lock()
	a.inFlight[r] = struct{}{}
	a.slotMu.Unlock()
}

// untrack forgets r and frees its slot, if it holds one.
func (a *Agent) untrack(r *run) {
	r.releaseSlot()
	a.slotMu.Lock()
	delete(a.inFlight, r)
	a.slotMu.Unlock()
}

// slotPool is one provider's node-wide slots: at most limit runs hold one
// at once. Reload changes limit; a pool over a lowered limit admits
// nothing until enough holders released theirs.
type slotPool struct {
	mu    sync.Mutex // guards the fields below
	held  int
	limit int           // max(capacity, long_capacity), ≥ 1
	freed chan struct{} // closed and replaced when a slot frees or limit grows
}

func newSlotPool(limit int) *slotPool {
	return &slotPool{limit: max(limit, 1), freed: make(chan struct{})}
}

// tryTake takes a slot if one is free; else it returns a channel closed
// when one may have freed.
func (s *slotPool) tryTake() (ok bool, freed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held < s.limit {
		s.held++
		return true, nil
	}
	return false, s.freed
}

// release gives one slot back.
func (s *slotPool) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held--
	s.wakeLocked()
}

// setLimit changes the pool's size.
func (s *slotPool) setLimit(limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = max(limit, 1)
	s.wakeLocked()
}

// size is the pool's limit.
func (s *slotPool) size() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

func (s *slotPool) wakeLocked() {
	close(s.freed)
	s.freed = make(chan struct{})
}

// acquireSlot takes one of r's provider's slots for r, waiting up to
// slotWait (agent's clock) for one to free; ErrProviderBusy when none
// did, or why r's work ended first (a Cancel, its stream or connection
// ending).
func (a *Agent) acquireSlot(r *run) error {
	pool := a.slots[r.provider]
	ok, freed := pool.tryTake()
	if ok {
		r.holdSlot(pool)
		return nil
	}
	timeout := make(chan struct{})
	t := a.clock.AfterFunc(slotWait, func() { close(timeout) })
	defer t.Stop()
	for {
		select {
		case <-freed:
			if ok, freed = pool.tryTake(); ok {
				r.holdSlot(pool)
				return nil
			}
		case <-timeout:
			return fmt.Errorf("%w: provider %q runs %d", ErrProviderBusy, r.provider, pool.size())
		case <-r.workCtx.Done():
			return context.Cause(r.workCtx)
		}
	}
}

// holdSlot records that r holds a slot of pool.
func (r *run) holdSlot(pool *slotPool) {
	r.slotMu.Lock()
	r.slot = pool
	r.slotMu.Unlock()
}

// releaseSlot frees r's provider slot, once: just before its terminal
// frame goes up (so an edge that reads it finds the slot free), or when
// the run is forgotten.
func (r *run) releaseSlot() {
	r.slotMu.Lock()
	s := r.slot
	r.slot = nil
	r.slotMu.Unlock()
	if s != nil {
		s.release()
	}
}
