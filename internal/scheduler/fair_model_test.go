package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"iop/internal/clock"
)

// The fair-order model test: random flows (with random weights), priority
// bands, admissions, releases, cancels, queue timeouts, capacity changes
// and reconnects (a node's newer generation, which re-resolves every
// waiter and hands slots out in queue order) on one node whose providers
// the groups share: g0 uses pa, g1 pa and pb, g2 only pc. After every step
// it checks, from the rules (fairTagLocked, enqueue, pushOutLocked):
//
//   - no provider above its capacity (but draining after a cut), and the
//     snapshot's in-flight, waiter, lease and per-flow counts;
//   - work conservation: no provider has a free slot while a waiter that
//     lists it waits;
//   - exactly once: each waiter settles once, each lease releases once;
//   - order: a waiter handed a slot never passes a waiter of a higher band
//     still waiting on that provider, nor an earlier one of its own flow
//     and band; with fairness off, no earlier one of its band at all (FIFO);
//   - shedding: a waiter is displaced only by a higher arrival at its
//     group's full queue, and it is the group's latest sheddable waiter;
//     an arrival refused for its expected wait is sheddable;
//   - fairness: on g2, for two flows A and B of one band, over every
//     interval in which both are backlogged, |grants_A/w_A − grants_B/w_B|
//     ≤ 1/w_A + 1/w_B (start-time fair queueing's bound, Goyal, Vin and
//     Cheng 1996, Theorem 1, for unit-cost requests), counted from a point
//     at which neither flow has a waiter queued behind one that left it
//     without a slot from the middle of its flow (that gap is paid by the
//     flow's later waiters: fairUnlinkLocked).

var (
	fairProviders = []string{"pa", "pb", "pc"}
	fairGroups    = map[string][]string{"g0": {"pa"}, "g1": {"pa", "pb"}, "g2": {"pc"}}
	fairGroupList = []string{"g0", "g1", "g2"}
	fairFlows     = []string{"f0", "f1", "f2"}
)

const fairNode = "n"

type fWaiter struct {
	w        *waiter
	group    string
	flow     string
	prio     Priority
	deadline time.Time
	done     bool
	key      resourceKey // of the lease it was handed
}

type fLease struct {
	l        *Lease
	key      resourceKey
	released bool
}

// pairKey names two flows of g2 in one band, a < b.
type pairKey struct {
	band uint8
	a, b string
}

type fairMachine struct {
	clk      *clock.Fake
	s        *Scheduler
	fair     bool
	gen      uint64
	capacity map[string]int
	weight   map[string]int
	waiters  []*fWaiter
	leases   []*fLease
	lastHeld map[resourceKey]int
	// displaced: the waiter the current admission may displace (nil: none);
	// pushable: those it may push out of a full fair queue (one of them).
	displaced *fWaiter
	pushable  []*fWaiter
	pushed    bool
	// served in the current step, in grant order.
	served []*fWaiter
	// removed: g2 waiters of the step that left without a slot.
	removed []*fWaiter
	// dirty: by (flow, band) of g2, the largest seq that may sit behind a
	// gap left by a waiter withdrawn from the middle of its flow.
	dirty map[string]uint64
	// backlog: the g2 (flow, band) pairs backlogged and clean at the last
	// check; grants the counts since both of a pair were.
	backlog map[string]bool
	grants  map[pairKey][2]int
}

func newFairMachine(t *rapid.T, fair bool) *fairMachine {
	clk := clock.NewFake(time.Unix(0, 0))
	mode := FairnessOff
	if fair {
		mode = FairnessOn
	}
	s, err := New(Config{Default: Policy{MaxQueue: 4, QueueTimeout: 10 * time.Second, Fairness: mode}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	m := &fairMachine{clk: clk, s: s, fair: fair, capacity: map[string]int{}, weight: map[string]int{},
		lastHeld: map[resourceKey]int{}, dirty: map[string]uint64{}, backlog: map[string]bool{}, grants: map[pairKey][2]int{}}
	for _, f := range fairFlows {
		m.weight[f] = rapid.IntRange(1, 4).Draw(t, "weight "+f)
	}
	m.reconnect(t)
	return m
}

func (m *fairMachine) resolver(group string) func() ([]Candidate, error) {
	return func() ([]Candidate, error) {
		var out []Candidate
		for _, p := range fairGroups[group] {
			out = append(out, Candidate{NodeID: fairNode, Generation: m.gen, ProviderID: p, Target: p})
		}
		return out, nil
	}
}

func (m *fairMachine) held(p string) int {
	n := 0
	for _, l := range m.leases {
		if !l.released && l.key.provider == p {
			n++
		}
	}
	return n
}

func (m *fairMachine) free(p string) bool { return m.held(p) < m.capacity[p] }

func (m *fairMachine) pending() []*fWaiter {
	var out []*fWaiter
	for _, w := range m.waiters {
		if !w.done {
			out = append(out, w)
		}
	}
	return out
}

func flowBand(flow string, band uint8) string { return fmt.Sprintf("%s/%d", flow, band) }

// withdrawn records that w, of g2, left without a slot: its flow's later
// waiters may now pay for its cost.
func (m *fairMachine) withdrawn(w *fWaiter) {
	if w.group != "g2" {
		return
	}
	fb := flowBand(w.flow, w.prio.band())
	for _, e := range m.pending() {
		if e.group == "g2" && e.flow == w.flow && e.prio == w.prio && e.w.seq > w.w.seq {
			m.dirty[fb] = max(m.dirty[fb], e.w.seq)
		}
	}
}

func (m *fairMachine) collect(t *rapid.T) {
	for _, w := range m.waiters {
		if w.done {
			continue
		}
		select {
		case r := <-w.w.ch:
			w.done = true
			switch {
			case r.lease != nil:
				c := r.lease.Candidate()
				if !slices.Contains(fairGroups[w.group], c.ProviderID) || c.Generation != m.gen {
					t.Fatalf("waiter %d of %s got %s generation %d", w.w.seq, w.group, c.ProviderID, c.Generation)
				}
				w.key = resourceKey{c.NodeID, c.ProviderID}
				m.leases = append(m.leases, &fLease{l: r.lease, key: w.key})
				m.served = append(m.served, w)
			case errors.Is(r.err, ErrQueueTimeout):
				if m.clk.Now().Before(w.deadline) {
					t.Fatalf("waiter %d timed out at %v before its deadline %v", w.w.seq, m.clk.Now(), w.deadline)
				}
				m.withdrawn(w)
			case errors.Is(r.err, ErrQueueFull):
				if !slices.Contains(m.pushable, w) || m.pushed {
					t.Fatalf("waiter %d (%s %s %s) pushed out of the queue; the rule allows only one of %d", w.w.seq, w.group, w.flow, w.prio, len(m.pushable))
				}
				m.pushed = true
				m.withdrawn(w)
			case errors.Is(r.err, ErrShed) && errors.Is(r.err, ErrDisplaced):
				if m.displaced != w {
					allowed := "none"
					if m.displaced != nil {
						allowed = fmt.Sprint(m.displaced.w.seq)
					}
					t.Fatalf("waiter %d (%s %s) displaced; the rule allows only %s", w.w.seq, w.group, w.prio, allowed)
				}
				m.displaced = nil
				m.withdrawn(w)
			default:
				t.Fatalf("waiter %d: unexpected outcome %v", w.w.seq, r.err)
			}
			select {
			case r := <-w.w.ch:
				t.Fatalf("second outcome for waiter %d: %+v", w.w.seq, r)
			default:
			}
		default:
		}
	}
}

// step runs one action's effect on the scheduler, then collects and checks
// what it did.
func (m *fairMachine) step(t *rapid.T, act func()) {
	m.served, m.displaced, m.pushable, m.pushed = m.served[:0], nil, nil, false
	act()
	m.collect(t)
	if m.displaced != nil {
		t.Fatalf("the rule sheds waiter %d to make room; it still waits", m.displaced.w.seq)
	}
	if len(m.pushable) > 0 && !m.pushed {
		t.Fatalf("the rule pushes one of %d waiters out of the full queue; none was", len(m.pushable))
	}
	pend := m.pending()
	for _, w := range m.served {
		for _, e := range pend {
			shares := slices.ContainsFunc(fairGroups[e.group], func(p string) bool { return slices.Contains(fairGroups[w.group], p) })
			if !shares {
				continue
			}
			if e.prio > w.prio && slices.Contains(fairGroups[e.group], m.leaseOf(w).provider) {
				t.Fatalf("waiter %d (%s) got %s while waiter %d (%s) waits for it", w.w.seq, w.prio, m.leaseOf(w).provider, e.w.seq, e.prio)
			}
			if e.prio != w.prio || e.w.seq > w.w.seq || !slices.Contains(fairGroups[e.group], m.leaseOf(w).provider) {
				continue
			}
			if !m.fair {
				t.Fatalf("fairness off: waiter %d got %s before earlier waiter %d of its band", w.w.seq, m.leaseOf(w).provider, e.w.seq)
			}
			if e.group == w.group && e.flow == w.flow {
				t.Fatalf("waiter %d of flow %s overtook earlier waiter %d of its flow", w.w.seq, w.flow, e.w.seq)
			}
		}
	}
	m.checkFair(t)
	m.check(t)
}

// leaseOf returns the key of the lease handed to w.
func (m *fairMachine) leaseOf(w *fWaiter) resourceKey { return w.key }

func (m *fairMachine) checkFair(t *rapid.T) {
	if !m.fair {
		return
	}
	// Backlogged, clean (flow, band) pairs of g2 now.
	now := map[string]bool{}
	for _, e := range m.pending() {
		if e.group != "g2" {
			continue
		}
		fb := flowBand(e.flow, e.prio.band())
		now[fb] = true
	}
	for _, e := range m.pending() {
		if e.group == "g2" && e.w.seq <= m.dirty[flowBand(e.flow, e.prio.band())] {
			delete(now, flowBand(e.flow, e.prio.band()))
		}
	}
	stepGrants := map[string]int{}
	for _, w := range m.served {
		if w.group == "g2" {
			stepGrants[flowBand(w.flow, w.prio.band())]++
		}
	}
	for band := uint8(0); band < 3; band++ {
		for i, a := range fairFlows {
			for _, b := range fairFlows[i+1:] {
				k := pairKey{band, a, b}
				fa, fbb := flowBand(a, band), flowBand(b, band)
				if !(m.backlog[fa] && m.backlog[fbb] && now[fa] && now[fbb]) {
					delete(m.grants, k)
					continue
				}
				g := m.grants[k]
				g[0] += stepGrants[fa]
				g[1] += stepGrants[fbb]
				m.grants[k] = g
				wa, wb := m.weight[a], m.weight[b]
				if d := g[0]*wb - g[1]*wa; d > wa+wb || -d > wa+wb {
					t.Fatalf("band %d: flow %s (weight %d) got %d slots, flow %s (weight %d) %d, both backlogged: beyond the fair bound",
						band, a, wa, g[0], b, wb, g[1])
				}
			}
		}
	}
	m.backlog = now
}

func (m *fairMachine) check(t *rapid.T) {
	snap := m.s.Snapshot()
	for _, p := range snap.Providers {
		if want := m.held(p.ProviderID); p.InFlight != want {
			t.Fatalf("%s in-flight %d, reference %d", p.ProviderID, p.InFlight, want)
		}
		if p.InFlight > p.Capacity && p.InFlight > m.lastHeld[resourceKey{p.NodeID, p.ProviderID}] {
			t.Fatalf("%s grew to %d above capacity %d", p.ProviderID, p.InFlight, p.Capacity)
		}
		m.lastHeld[resourceKey{p.NodeID, p.ProviderID}] = p.InFlight
	}
	pend := m.pending()
	if snap.Waiters != len(pend) {
		t.Fatalf("scheduler has %d waiters, reference %d", snap.Waiters, len(pend))
	}
	live := 0
	for _, l := range m.leases {
		if !l.released {
			live++
		}
	}
	if snap.Leases != live {
		t.Fatalf("scheduler has %d leases, reference %d", snap.Leases, live)
	}
	want := map[string]map[FlowSnapshot]int{}
	for _, w := range pend {
		for _, p := range fairGroups[w.group] {
			if m.free(p) {
				t.Fatalf("waiter %d (%s) waits while %s is free", w.w.seq, w.group, p)
			}
		}
		if want[w.group] == nil {
			want[w.group] = map[FlowSnapshot]int{}
		}
		want[w.group][FlowSnapshot{Flow: w.flow, Priority: w.prio}]++
	}
	for _, g := range snap.Groups {
		got := map[FlowSnapshot]int{}
		for _, f := range g.Flows {
			got[FlowSnapshot{Flow: f.Flow, Priority: f.Priority}] = f.Queued
		}
		if len(got) != len(want[g.Name]) {
			t.Fatalf("group %s flows %+v, reference %v", g.Name, g.Flows, want[g.Name])
		}
		for k, n := range want[g.Name] {
			if got[k] != n {
				t.Fatalf("group %s flow %q %s: %d queued, reference %d", g.Name, k.Flow, k.Priority, got[k], n)
			}
		}
	}
}

func (m *fairMachine) admit(t *rapid.T) {
	group := rapid.SampledFrom(fairGroupList).Draw(t, "group")
	flow := rapid.SampledFrom(fairFlows).Draw(t, "flow")
	prio := rapid.SampledFrom([]Priority{PriorityStandard, PriorityStandard, PriorityCritical, PrioritySheddable}).Draw(t, "priority")
	m.step(t, func() {
		queued := 0
		var lastShed *fWaiter
		for _, w := range m.pending() {
			if w.group == group {
				queued++
				if w.prio == PrioritySheddable && (lastShed == nil || w.w.seq > lastShed.w.seq) {
					lastShed = w
				}
			}
		}
		anyFree := slices.ContainsFunc(fairGroups[group], m.free)
		if !anyFree && queued >= 4 && prio != PrioritySheddable {
			m.displaced = lastShed
		}
		if !anyFree && queued >= 4 && m.displaced == nil && m.fair {
			m.pushable = m.pushOut(group, flow, prio)
		}
		lease, w, err := m.s.enqueue(Request{Group: group, Flow: flow, Weight: m.weight[flow], Priority: prio, Resolve: m.resolver(group)})
		switch {
		case anyFree:
			if err != nil || lease == nil {
				t.Fatalf("a provider of %s is free, got %v %v", group, w, err)
			}
			m.leases = append(m.leases, &fLease{l: lease, key: lease.res.key})
		case queued >= 4 && m.displaced == nil && len(m.pushable) == 0:
			if !errors.Is(err, ErrQueueFull) {
				t.Fatalf("full queue: got %v %v %v", lease, w, err)
			}
		case errors.Is(err, ErrShed):
			if prio != PrioritySheddable || !errors.Is(err, ErrExpectedWait) || lease != nil || w != nil {
				t.Fatalf("%s arrival refused with %v", prio, err)
			}
		default:
			if err != nil || w == nil {
				t.Fatalf("expected queued, got %v %v", lease, err)
			}
			m.waiters = append(m.waiters, &fWaiter{w: w, group: group, flow: flow, prio: prio, deadline: m.clk.Now().Add(10 * time.Second)})
		}
	})
}

func (m *fairMachine) release(t *rapid.T) {
	var live []*fLease
	for _, l := range m.leases {
		if !l.released {
			live = append(live, l)
		}
	}
	if len(live) == 0 {
		t.Skip("no lease")
	}
	l := rapid.SampledFrom(live).Draw(t, "lease")
	twice := rapid.Bool().Draw(t, "twice")
	m.step(t, func() {
		if !l.l.Release("done") {
			t.Fatal("first release of a lease returned false")
		}
		l.released = true
		if twice && l.l.Release("again") {
			t.Fatal("second release of a lease returned true")
		}
	})
}

func (m *fairMachine) cancel(t *rapid.T) {
	p := m.pending()
	if len(p) == 0 {
		t.Skip("no waiter")
	}
	w := rapid.SampledFrom(p).Draw(t, "waiter")
	m.step(t, func() {
		if err := m.s.abandon(w.w, context.Canceled); !errors.Is(err, context.Canceled) {
			t.Fatalf("abandon: %v", err)
		}
		m.withdrawn(w)
		w.done = true
	})
}

func (m *fairMachine) advance(t *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 6).Draw(t, "seconds")) * time.Second
	m.step(t, func() { m.clk.Advance(d) })
}

func (m *fairMachine) setCapacity(t *rapid.T) {
	p := rapid.SampledFrom(fairProviders).Draw(t, "provider")
	c := rapid.IntRange(1, 3).Draw(t, "capacity")
	m.step(t, func() {
		if err := m.s.SetCapacity(fairNode, p, c, 0); err != nil {
			t.Fatal(err)
		}
		m.capacity[p] = c
	})
}

// reconnect activates the node's next generation with new capacities: every
// waiter re-resolves and free slots go out in queue order.
func (m *fairMachine) reconnect(t *rapid.T) {
	var specs []ResourceSpec
	caps := map[string]int{}
	for _, p := range fairProviders {
		caps[p] = rapid.IntRange(1, 3).Draw(t, "capacity "+p)
		specs = append(specs, ResourceSpec{ProviderID: p, Capacity: caps[p]})
	}
	m.step(t, func() {
		m.gen++
		if err := m.s.Activate(fairNode, m.gen, specs, nil); err != nil {
			t.Fatal(err)
		}
		m.capacity = caps
	})
}

func (m *fairMachine) drain(t *rapid.T) {
	for _, w := range m.pending() {
		_ = m.s.abandon(w.w, context.Canceled)
		w.done = true
	}
	for _, l := range m.leases {
		l.l.Release("end")
	}
	snap := m.s.Snapshot()
	if snap.Leases != 0 || snap.Waiters != 0 {
		t.Fatalf("leftovers at the end: %+v", snap)
	}
	for _, g := range snap.Groups {
		if g.Queued != 0 || len(g.Flows) != 0 {
			t.Fatalf("group not empty at the end: %+v", g)
		}
		if gr := m.s.groups[g.Name]; len(gr.flows) != 0 || gr.shedHead != nil || gr.shedTail != nil || gr.bandQueued != [bands]int{} {
			t.Fatalf("group %s keeps flow state with no waiter: %d flows, bands %v", g.Name, len(gr.flows), gr.bandQueued)
		}
	}
	if n := m.clk.Pending(); n != 0 {
		t.Fatalf("%d queue timers left", n)
	}
}

func testFairModel(t *testing.T, fair bool) {
	rapid.Check(t, func(t *rapid.T) {
		m := newFairMachine(t, fair)
		actions := map[string]func(*rapid.T){
			"admit":       m.admit,
			"admit2":      m.admit,
			"admit3":      m.admit,
			"admit4":      m.admit,
			"admit5":      m.admit,
			"release":     m.release,
			"release2":    m.release,
			"release3":    m.release,
			"cancel":      m.cancel,
			"advance":     m.advance,
			"setCapacity": m.setCapacity,
			"reconnect":   m.reconnect,
		}
		for range 4 {
			t.Repeat(actions)
		}
		m.drain(t)
	})
}

func TestFairModel(t *testing.T)     { testFairModel(t, true) }
func TestFairModelFIFO(t *testing.T) { testFairModel(t, false) }

// pushOut returns the waiters an arrival of flow at priority prio may push
// out of group's full fair queue (longest-queue drop, pushOutLocked's
// rule): of the flows other than flow with a waiter of prio or lower, those
// with the most queued for their weight, if that is more than flow would
// have with the arrival; of each, its latest waiter of its lowest priority
// at or below prio.
func (m *fairMachine) pushOut(group, flow string, prio Priority) []*fWaiter {
	queued := map[string]int{}
	for _, w := range m.pending() {
		if w.group == group {
			queued[w.flow]++
		}
	}
	latest := map[string]*fWaiter{}
	for _, w := range m.pending() {
		if w.group != group || w.flow == flow || w.prio > prio {
			continue
		}
		l := latest[w.flow]
		if l == nil || w.prio < l.prio || (w.prio == l.prio && w.w.seq > l.w.seq) {
			latest[w.flow] = w
		}
	}
	var best []*fWaiter
	bq, bw := 0, 1
	for f, w := range latest {
		q, wt := queued[f], m.weight[f]
		switch {
		case len(best) == 0 || q*bw > bq*wt:
			best, bq, bw = []*fWaiter{w}, q, wt
		case q*bw == bq*wt:
			best = append(best, w)
		}
	}
	if len(best) == 0 || bq*m.weight[flow] <= (queued[flow]+1)*bw {
		return nil
	}
	return best
}
