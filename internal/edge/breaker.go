package edge

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/scheduler"
)

// Circuit states, as snapshots and the admin API show them.
const (
	CircuitClosed   = "closed"    // in rotation
	CircuitOpen     = "open"      // out of rotation until its cool-down ends
	CircuitHalfOpen = "half_open" // cool-down over: one trial request may go
)

// outcome is what one attempt says of its provider's health.
type outcome uint8

const (
	// outcomeNeutral says nothing: the client's own fault (a 4xx other than
	// 429), a cancel, the node lost (its generation is fenced instead), or
	// an attempt that ended before its provider answered.
	outcomeNeutral outcome = iota
	// outcomeOK: the provider answered (a 2xx head, a started, delta or
	// complete event) and its answer did not end in a provider failure
	// (Run.observe decides it at the answer's end).
	outcomeOK
	// outcomeFailed: the provider failed before its first byte (a status
	// of 500 or above, or 429; unreachable; a timeout; an error object in
	// its 2xx), or its answer, once begun, ended in such a failure (an
	// error event or object, a broken stream), or its node did not open or
	// refused the dispatch.
	outcomeFailed
)

// providerKey names one provider of one node, whatever its generation.
type providerKey struct{ node, provider string }

// breakers is the circuit breaker of every (node, provider). A circuit
// counts its provider's failures in a row; at cfg.Failures it opens: the
// provider is no candidate (the resolver filters it) until its cool-down
// ends. It is then half-open: one trial request may be admitted to it; its
// success closes the circuit, its failure opens it again for twice the
// previous cool-down (at most cfg.MaxCoolDown), and an attempt that says
// nothing (the client left first) lets another request be the trial.
//
// State is kept per node id and provider id across the node's
// generations: a node that reconnects does not make a broken model server
// work. The circuits of a node gone longer than ForgetAfter are forgotten
// with it (forgetNode), so nodes that come and go leave none behind.
//
// Each change of rotation (a circuit opens, its cool-down ends on the
// edge's clock, a trial ends without failing) re-activates the node's
// resources in the scheduler, so queued requests re-resolve: a half-open
// provider's trial slot goes to the earliest waiter that can use it. A
// circuit is published (out) before that re-resolution, so it sees it.
type breakers struct {
	cfg   BreakerConfig // Failures < 0: every method admits everything
	clock scheduler.Clock
	log   *slog.Logger // a circuit that closes is logged here (one that opens, by Service.circuitOpened)
	// onBack, when set (by NewServer, before use), is called with no lock
	// held when a half-open circuit's trial ended without a failure (the
	// circuit closed, or the trial said nothing and another may be tried):
	// the provider is back in rotation, so queued requests re-resolve.
	onBack func(providerKey)

	// out holds the circuits that are open or half-open, as last
	// published under mu; the value is never modified. What a resolver
	// asks (inRotation) and what snapshots show (state, coolDownLeft) are
	// read from it without a lock, so no lock of the breakers is taken
	// under the scheduler's lock.
	out atomic.Pointer[cowMap[providerKey, rotation]]

	mu       sync.Mutex // serializes the writers; guards the fields below; a leaf lock
	circuits map[providerKey]*circuit
	byNode   map[string][]providerKey // the keys of circuits, by node id
}

// rotation is what readers see of an open or half-open circuit: the end
// of its cool-down, and whether a half-open trial is in flight.
type rotation struct {
	openUntil time.Time
	trial     bool
}

type circuit struct {
	failures  int       // failures in a row while closed
	open      bool      // open or half-open (openUntil passed)
	openUntil time.Time // end of the cool-down
	coolDown  time.Duration
	trial     bool // a half-open trial is in flight
}

func newBreakers(cfg BreakerConfig, clk scheduler.Clock, log *slog.Logger) *breakers {
	b := &breakers{cfg: cfg, clock: clk, log: log, circuits: make(map[providerKey]*circuit), byNode: make(map[string][]providerKey)}
	b.out.Store(&cowMap[providerKey, rotation]{})
	return b
}

// publishLocked publishes k's circuit as it now is (b.circuits[k], nil for
// none) to the readers of b.out. Callers hold b.mu.
func (b *breakers) publishLocked(k providerKey) {
	out := *b.out.Load()
	old, was := out.get(k)
	if c := b.circuits[k]; c != nil && c.open {
		if r := (rotation{c.openUntil, c.trial}); !was || r != old {
			out = out.with(k, r)
			b.out.Store(&out)
		}
	} else if was {
		out = out.without(k)
		b.out.Store(&out)
	}
}

// forgetNode drops every circuit of node (gone longer than ForgetAfter).
func (b *breakers) forgetNode(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range b.byNode[node] {
		delete(b.circuits, k)
		b.publishLocked(k)
	}
	delete(b.byNode, node)
}

func (b *breakers) disabled() bool { return b.cfg.Failures < 0 }

// stateLocked returns k's state at now.
func (b *breakers) stateLocked(c *circuit, now time.Time) string {
	switch {
	case c == nil || !c.open:
		return CircuitClosed
	case now.Before(c.openUntil):
		return CircuitOpen
	default:
		return CircuitHalfOpen
	}
}

// published returns k's open or half-open circuit as last published, and
// whether it has one. It takes no lock.
func (b *breakers) published(k providerKey) (rotation, bool) {
	if b.disabled() {
		return rotation{}, false
	}
	return b.out.Load().get(k)
}

// state returns the circuit state of k: CircuitClosed, CircuitOpen or
// CircuitHalfOpen. It takes no lock.
func (b *breakers) state(k providerKey) string {
	r, open := b.published(k)
	switch {
	case !open:
		return CircuitClosed
	case b.clock.Now().Before(r.openUntil):
		return CircuitOpen
	default:
		return CircuitHalfOpen
	}
}

// inRotation reports whether k may be a candidate for a new admission: its
// circuit is closed, or half-open with no trial in flight. It takes no
// lock (it reads the published circuits), so it may be called under the
// scheduler's lock.
func (b *breakers) inRotation(k providerKey) bool {
	r, open := b.published(k)
	switch {
	case !open:
		return true
	case b.clock.Now().Before(r.openUntil):
		return false
	default:
		return !r.trial
	}
}

// ticket is one admitted attempt's right to use a provider; done reports
// its outcome, once (later calls change nothing).
type ticket struct {
	b     *breakers
	key   providerKey
	trial bool // the half-open circuit's trial
	once  sync.Once
}

// acquire takes a ticket for an attempt just admitted to k, or reports
// false when k is out of rotation (its circuit opened, or another request
// took the half-open trial, since the resolver ran).
func (b *breakers) acquire(k providerKey) (*ticket, bool) {
	t := &ticket{b: b, key: k}
	if b.disabled() {
		return t, true
	}
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.circuits[k]
	switch b.stateLocked(c, now) {
	case CircuitOpen:
		return nil, false
	case CircuitHalfOpen:
		if c.trial {
			return nil, false
		}
		c.trial, t.trial = true, true
		b.publishLocked(k)
	}
	return t, true
}

// done records the attempt's outcome; it reports whether this opened the
// circuit. Only the first call counts. A successful trial closes the
// circuit, which is logged (info, with node and provider).
func (t *ticket) done(o outcome) (opened bool) {
	if t == nil {
		return false
	}
	closed, back := false, false
	t.once.Do(func() { opened, closed, back = t.b.record(t, o) })
	if closed {
		t.b.log.Info("provider back in rotation: circuit closed", "node", t.key.node, "provider", t.key.provider)
	}
	if back && t.b.onBack != nil {
		t.b.onBack(t.key)
	}
	return opened
}

// coolDownLeft returns how long k's circuit stays open from now (0 when it
// is not open). It takes no lock.
func (b *breakers) coolDownLeft(k providerKey) time.Duration {
	if r, open := b.published(k); open {
		if now := b.clock.Now(); now.Before(r.openUntil) {
			return r.openUntil.Sub(now)
		}
	}
	return 0
}

// record applies an attempt's outcome to its circuit and reports whether
// that opened or closed it, and whether a trial ended without a failure
// (back: the provider may be a candidate again).
func (b *breakers) record(t *ticket, o outcome) (opened, closed, back bool) {
	if b.disabled() {
		return false, false, false
	}
	now := b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	defer b.publishLocked(t.key) // before the unlock
	c := b.circuits[t.key]
	if c == nil {
		if o != outcomeFailed {
			return false, false, false
		}
		c = &circuit{coolDown: b.cfg.CoolDown}
		b.circuits[t.key] = c
		b.byNode[t.key.node] = append(b.byNode[t.key.node], t.key)
	}
	if t.trial {
		c.trial = false
		switch o {
		case outcomeOK:
			*c = circuit{coolDown: b.cfg.CoolDown}
			return false, true, true
		case outcomeFailed:
			c.coolDown = min(2*c.coolDown, b.cfg.MaxCoolDown)
			c.openUntil = now.Add(c.coolDown)
			return true, false, false
		}
		return false, false, true
	}
	if c.open {
		// An attempt admitted before the circuit opened: its outcome is
		// older news than the trial's.
		return false, false, false
	}
	switch o {
	case outcomeOK:
		c.failures = 0
	case outcomeFailed:
		c.failures++
		if c.failures >= b.cfg.Failures {
			c.open, c.failures = true, 0
			c.openUntil = now.Add(c.coolDown)
			return true, false, false
		}
	}
	return false, false, false
}
