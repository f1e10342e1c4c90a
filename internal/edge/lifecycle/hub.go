package lifecycle

import (
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBuffer is the per-subscriber buffer Subscribe uses for a size ≤ 0,
// in events.
const DefaultBuffer = 256

// Hub fans published events out to subscribers. The zero value is not
// usable; create one with NewHub.
type Hub struct {
	now func() time.Time
	// active counts subscriptions, so publishers can skip building events
	// nobody reads.
	active atomic.Int64

	mu     sync.Mutex // guards the fields below
	subs   map[*Subscription]struct{}
	closed bool
}

// NewHub returns a Hub that stamps events without a Time with now (nil
// means time.Now).
func NewHub(now func() time.Time) *Hub {
	if now == nil {
		now = time.Now
	}
	return &Hub{now: now, subs: make(map[*Subscription]struct{})}
}

// Subscription is one subscriber's buffered view of the Hub's events.
type Subscription struct {
	h       *Hub
	ch      chan Event
	dropped atomic.Bool
}

// Subscribe returns a new subscription with room for buffer events (≤ 0
// means DefaultBuffer). On a closed Hub it returns a subscription whose
// channel is already closed.
func (h *Hub) Subscribe(buffer int) *Subscription {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	s := &Subscription{h: h, ch: make(chan Event, buffer)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		close(s.ch)
		return s
	}
	h.subs[s] = struct{}{}
	h.active.Add(1)
	return s
}

// Active reports whether anyone is subscribed.
func (h *Hub) Active() bool { return h.active.Load() > 0 }

// Observe publishes e: see Publish. It makes a Hub an Observer.
func (h *Hub) Observe(e Event) { h.Publish(e) }

// Publish offers e to every subscription without blocking. A subscription
// whose buffer is full is dropped: its channel is closed after the events
// it already holds, and its Dropped reports true. An event without a Time
// gets the Hub's clock reading.
func (h *Hub) Publish(e Event) {
	if e.Time.IsZero() {
		e.Time = h.now()
	}
	if e.QueueWait > 0 {
		e.QueueWaitSeconds = e.QueueWait.Seconds()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		select {
		case s.ch <- e:
		default:
			s.dropped.Store(true)
			h.removeLocked(s)
		}
	}
}

// Close ends every subscription (their channels close after the events
// they hold) and makes later ones start closed. It is idempotent.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for s := range h.subs {
		h.removeLocked(s)
	}
}

func (h *Hub) removeLocked(s *Subscription) {
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	h.active.Add(-1)
	close(s.ch)
}

// Events returns the channel events arrive on. It is closed when the
// subscription ends: by Close, by the Hub closing, or by being dropped.
func (s *Subscription) Events() <-chan Event { return s.ch }

// Dropped reports whether the subscription was dropped because its buffer
// was full.
func (s *Subscription) Dropped() bool { return s.dropped.Load() }

// Close ends the subscription. It is idempotent.
func (s *Subscription) Close() {
	s.h.mu.Lock()
	defer s.h.mu.Unlock()
	s.h.removeLocked(s)
}
