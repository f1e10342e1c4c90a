package scheduler

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"iop/internal/clock"
)

// The batch band's model-based test: random interactive admissions (every
// interactive band) and batch admissions on three groups over two
// providers of one node, releases (duplicates included), cancels, queue
// timeouts, capacity changes (cuts included), headroom changes and node
// restarts (fence, then a new generation). After every step it checks:
//
//   - capacity: no provider above its capacity, except draining after a
//     cut (its in-flight count never rises while above);
//   - never ahead: no batch request is handed a slot of a provider while
//     an interactive waiter listing that provider is still waiting;
//   - headroom: a provider that handed a batch request a slot in the step
//     keeps its headroom h = min(H, capacity−1) free after it, and the
//     backoff's slots: min(k, max(h, 1)) more, k the interactive requests
//     granted a slot after waiting in a group listing it within the
//     policy's Backoff (the latest capacity of them);
//   - work conservation: no interactive waiter lists a provider with a
//     free slot; no batch waiter lists a provider with room for a batch
//     request (a free slot beyond the headroom and the backoff's slots,
//     no interactive waiter on it) — with no interactive load, batch work
//     fills capacity − headroom, and a backoff that passed hands its
//     slots out at once;
//   - FIFO: a batch request is never handed a slot while an earlier batch
//     waiter of its group and flow waits (of its group, with fairness off;
//     batch requests come from two flows, fairness on or off);
//     waiter of its group waits;
//   - outcomes: a batch waiter ends only with a lease, its own queue
//     timeout, a cancel or a restart of its node (never displaced by an
//     interactive arrival, never ErrQueueFull once queued);
//   - leases: each is released exactly once (its second Release reports
//     false); at the end every counter is back to zero.

var (
	batchProviders = []string{"pa", "pb"}
	batchGroups    = map[string][]string{"g0": {"pa"}, "g1": {"pb"}, "g2": {"pa", "pb"}}
	batchGroupList = []string{"g0", "g1", "g2"}
)

const (
	batchModelTimeout      = 10 * time.Second // interactive queue timeout
	batchModelBatchTimeout = 25 * time.Second
)

type bLease struct {
	l        *Lease
	provider string
	batch    bool
	released bool
}

type bWaiter struct {
	w        *waiter
	group    string
	flow     string
	prio     Priority
	deadline time.Time
	seq      int
}

type batchMachine struct {
	clk      *clock.Fake
	s        *Scheduler
	gen      uint64
	capacity map[string]int
	fair     bool          // the groups' fairness is on
	headroom int           // the policy's, as configured (negative: none)
	backoff  time.Duration // the policy's Backoff (0: none)
	// waited: per provider, until when each interactive wait counts, in
	// the order the waits were granted (the backoff's state).
	waited   map[string][]time.Time
	leases   []*bLease
	waiters  []*bWaiter
	seq      int
	lastHeld map[string]int
	// restarted: the step fenced the node (waiters may fail unavailable).
	restarted bool
	// granted: providers that handed a batch request a slot in the step.
	granted map[string]bool
}

func newBatchMachine(t *rapid.T) *batchMachine {
	clk := clock.NewFake(time.Unix(0, 0))
	m := &batchMachine{clk: clk, capacity: map[string]int{}, lastHeld: map[string]int{}, waited: map[string][]time.Time{}}
	m.headroom = rapid.IntRange(-1, 3).Draw(t, "headroom")
	m.backoff = drawBackoff(t)
	m.fair = rapid.Bool().Draw(t, "fair")
	fairness := FairnessOff
	if m.fair {
		fairness = FairnessOn
	}
	s, err := New(Config{
		Default: Policy{MaxQueue: 4, QueueTimeout: batchModelTimeout, ReconnectGrace: -1, Fairness: fairness},
		Clock:   clk,
		Batch:   BatchPolicy{Headroom: m.headroom, MaxQueue: 6, QueueTimeout: batchModelBatchTimeout, Backoff: m.backoff},
	})
	if err != nil {
		t.Fatal(err)
	}
	m.s = s
	for _, p := range batchProviders {
		m.capacity[p] = rapid.IntRange(1, 4).Draw(t, "capacity")
	}
	m.connect(t)
	return m
}

func (m *batchMachine) connect(t *rapid.T) {
	m.gen++
	var specs []ResourceSpec
	for _, p := range batchProviders {
		specs = append(specs, ResourceSpec{ProviderID: p, Capacity: m.capacity[p]})
	}
	if err := m.s.Activate("n", m.gen, specs, nil); err != nil {
		t.Fatal(err)
	}
}

func (m *batchMachine) resolver(group string) func() ([]Candidate, error) {
	return func() ([]Candidate, error) {
		var out []Candidate
		for _, p := range batchGroups[group] {
			out = append(out, cand("n", m.gen, p))
		}
		return out, nil
	}
}

// room is the headroom the test expects of provider p: min(H, capacity−1).
func (m *batchMachine) room(p string) int {
	h := m.headroom
	if h == 0 {
		h = DefaultBatchHeadroom
	}
	return max(min(h, m.capacity[p]-1), 0)
}

// drawBackoff draws the batch policy's Backoff: none, or a few of the
// model's clock steps (1–12 s).
func drawBackoff(t *rapid.T) time.Duration {
	return rapid.SampledFrom([]time.Duration{0, 0, 3 * time.Second, 7 * time.Second, 20 * time.Second}).Draw(t, "backoff")
}

// yielded counts, with the backoff on, a wait of an interactive waiter of
// group granted a slot: on each provider the group lists, until now +
// Backoff; a provider keeps its latest capacity of them.
func (m *batchMachine) yielded(group string) {
	if m.backoff <= 0 {
		return
	}
	now := m.clk.Now()
	for _, p := range batchGroups[group] {
		w := m.live(p, now)
		if len(w) >= m.capacity[p] {
			w = w[1:]
		}
		m.waited[p] = append(w, now.Add(m.backoff))
	}
}

// live is p's waits that still count at now.
func (m *batchMachine) live(p string, now time.Time) []time.Time {
	var out []time.Time
	for _, until := range m.waited[p] {
		if until.After(now) {
			out = append(out, until)
		}
	}
	return out
}

// held is how many slots beyond the headroom p keeps from batch requests
// now: min(k, max(h, 1)) for k waits that count.
func (m *batchMachine) held(p string) int {
	return min(len(m.live(p, m.clk.Now())), max(m.room(p), 1))
}

func (m *batchMachine) lists(w *bWaiter, p string) bool {
	for _, q := range batchGroups[w.group] {
		if q == p {
			return true
		}
	}
	return false
}

func (m *batchMachine) inFlight(p string) int {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	return m.s.resources[resourceKey{"n", p}].inFlight
}

// batchInFlight is the scheduler's count of batch leases on p.
func (m *batchMachine) batchInFlight(p string) int {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	return m.s.resources[resourceKey{"n", p}].batchInFlight
}

func (m *batchMachine) admit(t *rapid.T, prio Priority) {
	group := rapid.SampledFrom(batchGroupList).Draw(t, "group")
	flow := "f"
	if prio == PriorityBatch {
		flow = rapid.SampledFrom([]string{"f", "g"}).Draw(t, "flow")
	}
	req := Request{Group: group, Priority: prio, Flow: flow, Resolve: m.resolver(group)}
	l, w, err := m.s.enqueue(req)
	switch {
	case err != nil:
		if prio == PriorityBatch && !errors.Is(err, ErrQueueFull) {
			t.Fatalf("batch admission: %v", err)
		}
		if prio != PriorityBatch && !errors.Is(err, ErrQueueFull) && !errors.Is(err, ErrShed) {
			t.Fatalf("%s admission: %v", prio, err)
		}
		if errors.Is(err, ErrQueueFull) && prio == PriorityBatch {
			n := 0
			for _, bw := range m.waiters {
				if bw.group == group && bw.prio == PriorityBatch {
					n++
				}
			}
			if n < 6 {
				t.Fatalf("batch admission refused ErrQueueFull with %d batch waiters of %s (max 6)", n, group)
			}
		}
	case l != nil:
		m.took(t, l, prio == PriorityBatch)
	default:
		m.seq++
		m.waiters = append(m.waiters, &bWaiter{w: w, group: group, flow: flow, prio: prio, deadline: m.clk.Now().Add(m.timeout(prio)), seq: m.seq})
	}
}

func (m *batchMachine) timeout(p Priority) time.Duration {
	if p == PriorityBatch {
		return batchModelBatchTimeout
	}
	return batchModelTimeout
}

func (m *batchMachine) took(t *rapid.T, l *Lease, batch bool) {
	p := l.Info().ProviderID
	m.leases = append(m.leases, &bLease{l: l, provider: p, batch: batch})
	if batch {
		m.granted[p] = true
	}
}

func (m *batchMachine) admitBatch(t *rapid.T) { m.admit(t, PriorityBatch) }
func (m *batchMachine) admitInteractive(t *rapid.T) {
	m.admit(t, rapid.SampledFrom([]Priority{PriorityCritical, PriorityStandard, PriorityStandard, PrioritySheddable}).Draw(t, "priority"))
}

func (m *batchMachine) release(t *rapid.T) {
	if len(m.leases) == 0 {
		t.Skip("no lease")
	}
	i := rapid.IntRange(0, len(m.leases)-1).Draw(t, "lease")
	bl := m.leases[i]
	if got := bl.l.Release("done"); got == bl.released {
		t.Fatalf("lease on %s: Release reported %v, released before: %v", bl.provider, got, bl.released)
	}
	bl.released = true
	if rapid.Bool().Draw(t, "again") {
		if bl.l.Release("again") {
			t.Fatalf("lease on %s released twice", bl.provider)
		}
	}
	m.leases = append(m.leases[:i], m.leases[i+1:]...)
}

func (m *batchMachine) cancel(t *rapid.T) {
	if len(m.waiters) == 0 {
		t.Skip("no waiter")
	}
	i := rapid.IntRange(0, len(m.waiters)-1).Draw(t, "waiter")
	bw := m.waiters[i]
	if err := m.s.abandon(bw.w, context.Canceled); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandon: %v", err)
	}
	m.waiters = append(m.waiters[:i], m.waiters[i+1:]...)
}

func (m *batchMachine) advance(t *rapid.T) {
	m.clk.Advance(time.Duration(rapid.IntRange(1, 12).Draw(t, "seconds")) * time.Second)
}

func (m *batchMachine) setCapacity(t *rapid.T) {
	p := rapid.SampledFrom(batchProviders).Draw(t, "provider")
	c := rapid.IntRange(1, 4).Draw(t, "capacity")
	if err := m.s.SetCapacity("n", p, c, 0); err != nil {
		t.Fatal(err)
	}
	m.capacity[p] = c
}

// setHeadroom changes the batch policy's headroom and backoff; the waits
// counted keep counting until their own ends.
func (m *batchMachine) setHeadroom(t *rapid.T) {
	h := rapid.IntRange(-1, 3).Draw(t, "headroom")
	b := drawBackoff(t)
	if err := m.s.SetBatchPolicy(BatchPolicy{Headroom: h, MaxQueue: 6, QueueTimeout: batchModelBatchTimeout, Backoff: b}); err != nil {
		t.Fatal(err)
	}
	m.headroom, m.backoff = h, b
}

// restart fences the node's connection and connects a new generation:
// every lease is released by the fence, every waiter fails unavailable,
// and the waits the backoff counted go with the node's old resources.
func (m *batchMachine) restart(t *rapid.T) {
	m.s.Fence("n", m.gen)
	for _, bl := range m.leases {
		if bl.l.Release("after fence") {
			t.Fatalf("lease on %s released after its fence", bl.provider)
		}
	}
	m.leases = nil
	m.restarted = true
	// The fence drops the node's resources (no lease, no waiter left):
	// the new generation's start with no wait counted.
	m.waited = map[string][]time.Time{}
	m.connect(t)
}

// settle collects the outcomes of the waiters settled in the step, in
// queue-entry order, and checks them.
func (m *batchMachine) settle(t *rapid.T) {
	now := m.clk.Now()
	kept := m.waiters[:0]
	var grantedBatch []*bWaiter
	for _, bw := range m.waiters {
		var r result
		select {
		case r = <-bw.w.ch:
		default:
			if bw.w.state != waiting {
				t.Fatalf("waiter settled (state %d) without a result", bw.w.state)
			}
			kept = append(kept, bw)
			continue
		}
		switch {
		case r.lease != nil:
			m.took(t, r.lease, bw.prio == PriorityBatch)
			if bw.prio == PriorityBatch {
				grantedBatch = append(grantedBatch, bw)
			} else {
				m.yielded(bw.group)
			}
		case errors.Is(r.err, ErrQueueTimeout):
			if now.Before(bw.deadline) {
				t.Fatalf("%s waiter of %s timed out at %s, before its deadline %s", bw.prio, bw.group, now, bw.deadline)
			}
		case errors.Is(r.err, ErrProviderUnavailable) && m.restarted:
		case bw.prio != PriorityBatch && (errors.Is(r.err, ErrShed) || errors.Is(r.err, ErrQueueFull)):
		default:
			t.Fatalf("%s waiter of %s: %v", bw.prio, bw.group, r.err)
		}
	}
	m.waiters = kept
	// FIFO within the band (never ahead: check).
	for _, g := range grantedBatch {
		for _, bw := range m.waiters {
			if bw.prio == PriorityBatch && bw.group == g.group && (bw.flow == g.flow || !m.fair) && bw.seq < g.seq {
				t.Fatalf("batch waiter %d of %s got a slot before the earlier batch waiter %d", g.seq, g.group, bw.seq)
			}
		}
	}
}

func (m *batchMachine) check(t *rapid.T) {
	m.settle(t)
	for _, p := range batchProviders {
		held, c := m.inFlight(p), m.capacity[p]
		if held > c && held > m.lastHeld[p] {
			t.Fatalf("%s: %d in flight, capacity %d (was %d)", p, held, c, m.lastHeld[p])
		}
		m.lastHeld[p] = held
		batchLeases := 0
		for _, bl := range m.leases {
			if bl.batch && bl.provider == p {
				batchLeases++
			}
		}
		if got := m.batchInFlight(p); got != batchLeases {
			t.Fatalf("%s: batch in flight %d, want %d", p, got, batchLeases)
		}
		if m.granted[p] && held+m.room(p)+m.held(p) > c {
			t.Fatalf("%s handed a batch request a slot: %d in flight, capacity %d, headroom %d and backoff %d not kept", p, held, c, m.room(p), m.held(p))
		}
		interactive, batch := false, false
		for _, bw := range m.waiters {
			if !m.lists(bw, p) {
				continue
			}
			if bw.prio == PriorityBatch {
				batch = true
			} else {
				interactive = true
			}
		}
		if interactive && m.granted[p] {
			t.Fatalf("%s handed a batch request a slot while an interactive waiter lists it", p)
		}
		if interactive && held < c {
			t.Fatalf("%s: %d in flight of %d while an interactive waiter lists it", p, held, c)
		}
		if batch && !interactive && held+1+m.room(p)+m.held(p) <= c {
			m.s.mu.Lock()
			r := m.s.resources[resourceKey{"n", p}]
			got := fmt.Sprint(r.waited, r.waitedTimer != nil)
			m.s.mu.Unlock()
			t.Fatalf("%s: %d in flight of %d, headroom %d, backoff %d, while a batch waiter lists it (now %s; model's waits %v, scheduler's %s)", p, held, c, m.room(p), m.held(p), m.clk.Now(), m.waited[p], got)
		}
	}
	snap := m.s.Snapshot()
	if snap.Waiters != len(m.waiters) || snap.Leases != len(m.leases) {
		t.Fatalf("snapshot: %d waiters, %d leases; want %d, %d", snap.Waiters, snap.Leases, len(m.waiters), len(m.leases))
	}
	m.granted = map[string]bool{}
	m.restarted = false
}

func (m *batchMachine) drain(t *rapid.T) {
	for _, bw := range m.waiters {
		_ = m.s.abandon(bw.w, context.Canceled)
	}
	m.waiters = nil
	for _, bl := range m.leases {
		if !bl.l.Release("drain") {
			t.Fatalf("lease on %s: not released by drain", bl.provider)
		}
	}
	m.leases = nil
	// The backoff's timers fire once its waits stop counting.
	m.clk.Advance(time.Minute)
	snap := m.s.Snapshot()
	if snap.Waiters != 0 || snap.Leases != 0 {
		t.Fatalf("after drain: %d waiters, %d leases", snap.Waiters, snap.Leases)
	}
	for _, p := range snap.Providers {
		if p.InFlight != 0 || p.Queued != 0 || p.BatchInFlight != 0 {
			t.Fatalf("after drain: %s: %d in flight, %d queued", p.ProviderID, p.InFlight, p.Queued)
		}
	}
	for _, g := range snap.Groups {
		if g.Queued != 0 || g.Batch != 0 {
			t.Fatalf("after drain: group %s: %d queued, %d batch", g.Name, g.Queued, g.Batch)
		}
	}
	if n := m.clk.Pending(); n != 0 {
		t.Fatalf("%d queue timers left", n)
	}
}

func TestBatchModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newBatchMachine(t)
		m.granted = map[string]bool{}
		step := func(f func(*rapid.T)) func(*rapid.T) {
			return func(t *rapid.T) { f(t); m.check(t) }
		}
		actions := map[string]func(*rapid.T){
			"admitBatch":        step(m.admitBatch),
			"admitBatch2":       step(m.admitBatch),
			"admitBatch3":       step(m.admitBatch),
			"admitInteractive":  step(m.admitInteractive),
			"admitInteractive2": step(m.admitInteractive),
			"release":           step(m.release),
			"release2":          step(m.release),
			"release3":          step(m.release),
			"cancel":            step(m.cancel),
			"advance":           step(m.advance),
			"setCapacity":       step(m.setCapacity),
			"setHeadroom":       step(m.setHeadroom),
			"restart":           step(m.restart),
		}
		for range 3 {
			t.Repeat(actions)
		}
		m.drain(t)
	})
}
