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

// Actions call rapid's (*rapid.T).Skip when their precondition does not
// hold (no lease to release, no waiter to cancel, ...): that skips the one
// action and rapid draws another; it never skips the test.
//
// The model-based property test: random sequences of admit, cancel, clock
// advance, track, release (by lease and by run id, duplicates included),
// fence (current, stale, whole node), activate (current, stale, non-owner),
// capacity and policy changes, checked after every step against a plain
// reference model of the world.

var (
	modelNodes     = []string{"n0", "n1", "n2"}
	modelProviders = []string{"pa", "pb"}
	// Each group lists some (node-independent) providers; a candidate exists
	// on every connected node for each listed provider.
	modelGroups = map[string][]string{"g0": {"pa"}, "g1": {"pb"}, "g2": {"pa", "pb"}}
)

type mNode struct {
	gen       uint64 // current generation; 0 = never connected
	connected bool
	capacity  map[string]int
	long      map[string]int
}

type mLease struct {
	l        *Lease
	key      resourceKey
	long     bool
	released bool
	runID    string
}

type mWaiter struct {
	w        *waiter
	group    string
	long     bool
	deadline time.Time
	done     bool
	key      resourceKey // resource it was handed, if any
}

type machine struct {
	clk     *clock.Fake
	s       *Scheduler
	world   *world
	nodes   map[string]*mNode
	gens    uint64
	leases  []*mLease
	waiters []*mWaiter
	runs    int
	// held at the last check, to see a resource over capacity only drain
	lastHeld, lastLong map[resourceKey]int
	policy             map[string]Policy
}

func newMachine(t *rapid.T) *machine {
	clk := clock.NewFake(time.Unix(0, 0))
	s, err := New(Config{Default: Policy{MaxQueue: 3, QueueTimeout: 10 * time.Second}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	m := &machine{clk: clk, s: s, world: newWorld(), nodes: map[string]*mNode{}, lastHeld: map[resourceKey]int{}, lastLong: map[resourceKey]int{}}
	for _, n := range modelNodes {
		m.nodes[n] = &mNode{capacity: map[string]int{}, long: map[string]int{}}
	}
	m.policy = map[string]Policy{}
	for g := range modelGroups {
		m.policy[g] = Policy{MaxQueue: 3, QueueTimeout: 10 * time.Second}
	}
	m.syncWorld()
	return m
}

// syncWorld publishes the catalog: every group's candidates on connected nodes.
func (m *machine) syncWorld() {
	for g, providers := range modelGroups {
		var cands []Candidate
		for _, n := range modelNodes {
			node := m.nodes[n]
			if !node.connected {
				continue
			}
			for _, p := range providers {
				cands = append(cands, cand(n, node.gen, p))
			}
		}
		m.world.set(g, cands...)
	}
}

func (m *machine) held(key resourceKey, longOnly bool) int {
	n := 0
	for _, l := range m.leases {
		if !l.released && l.key == key && (!longOnly || l.long) {
			n++
		}
	}
	return n
}

// free reports whether the reference model has a slot for a request on key.
func (m *machine) free(key resourceKey, long bool) bool {
	node := m.nodes[key.node]
	if !node.connected {
		return false
	}
	capacity := node.capacity[key.provider]
	if m.held(key, false) >= capacity {
		return false
	}
	return !long || m.held(key, true) < node.long[key.provider]
}

// groupKeys returns the live resources a group's requests can use.
func (m *machine) groupKeys(group string) []resourceKey {
	var keys []resourceKey
	for _, n := range modelNodes {
		if !m.nodes[n].connected {
			continue
		}
		for _, p := range modelGroups[group] {
			keys = append(keys, resourceKey{n, p})
		}
	}
	return keys
}

// collect takes every settled waiter's outcome, checking it.
func (m *machine) collect(t *rapid.T) {
	var served []*mWaiter
	for _, w := range m.waiters {
		if w.done {
			continue
		}
		select {
		case r := <-w.w.ch:
			w.done = true
			switch {
			case r.lease != nil:
				m.leases = append(m.leases, &mLease{l: r.lease, key: r.lease.res.key, long: w.long})
				served = append(served, w)
				w.key = r.lease.res.key
				if r.lease.Info().QueueReason != ReasonQueued {
					t.Fatalf("handed-over lease has reason %q", r.lease.Info().QueueReason)
				}
			case errors.Is(r.err, ErrQueueTimeout):
				if m.clk.Now().Before(w.deadline) {
					t.Fatalf("timed out at %v before its deadline %v", m.clk.Now(), w.deadline)
				}
			case errors.Is(r.err, ErrProviderUnavailable):
				if len(m.groupKeys(w.group)) != 0 {
					t.Fatalf("provider unavailable while %v are live", m.groupKeys(w.group))
				}
			default:
				t.Fatalf("unexpected waiter outcome %v", r.err)
			}
			select {
			case r := <-w.w.ch:
				t.Fatalf("second outcome for one waiter: %+v", r)
			default:
			}
		default:
		}
	}
	// Enqueue order per resource: a waiter handed a slot never overtakes an
	// earlier one, still waiting, that could have used the same slot.
	for _, w := range served {
		for _, e := range m.pending() {
			if e.w.seq > w.w.seq || (e.long && !w.long) {
				continue
			}
			for _, k := range m.groupKeys(e.group) {
				if k == w.key {
					t.Fatalf("waiter %d got %v before earlier waiter %d", w.w.seq, k, e.w.seq)
				}
			}
		}
	}
}

func (m *machine) pending() []*mWaiter {
	var out []*mWaiter
	for _, w := range m.waiters {
		if !w.done {
			out = append(out, w)
		}
	}
	return out
}

func (m *machine) live() []*mLease {
	var out []*mLease
	for _, l := range m.leases {
		if !l.released {
			out = append(out, l)
		}
	}
	return out
}

func (m *machine) admit(t *rapid.T) {
	group := rapid.SampledFrom([]string{"g0", "g1", "g2"}).Draw(t, "group")
	long := rapid.Bool().Draw(t, "long")
	// What the reference expects.
	var want *resourceKey
	for _, k := range m.groupKeys(group) {
		if !m.free(k, long) {
			continue
		}
		if want == nil || refLess(m, k, *want) {
			k := k
			want = &k
		}
	}
	queued := 0
	for _, w := range m.pending() {
		if w.group == group {
			queued++
		}
	}
	maxQueue, timeout := m.policy[group].MaxQueue, m.policy[group].QueueTimeout
	lease, w, err := m.s.enqueue(Request{Group: group, Long: long, Resolve: m.world.resolver(group)})
	switch {
	case len(m.groupKeys(group)) == 0:
		if !errors.Is(err, ErrNoProvider) {
			t.Fatalf("no live provider: got %v %v %v", lease, w, err)
		}
	case want != nil:
		if err != nil || lease == nil {
			t.Fatalf("free slot on %v but got %v %v", *want, w, err)
		}
		if lease.res.key != *want {
			t.Fatalf("picked %v, reference picks %v", lease.res.key, *want)
		}
		m.leases = append(m.leases, &mLease{l: lease, key: lease.res.key, long: long})
	case queued >= maxQueue:
		if !errors.Is(err, ErrQueueFull) {
			t.Fatalf("queue of %d/%d: got %v %v %v", queued, maxQueue, lease, w, err)
		}
	default:
		if err != nil || w == nil {
			t.Fatalf("expected queued, got %v %v", lease, err)
		}
		m.waiters = append(m.waiters, &mWaiter{w: w, group: group, long: long, deadline: m.clk.Now().Add(timeout)})
	}
}

func refLess(m *machine, a, b resourceKey) bool {
	ca, cb := m.nodes[a.node].capacity[a.provider], m.nodes[b.node].capacity[b.provider]
	la, lb := m.held(a, false)*cb, m.held(b, false)*ca
	if la != lb {
		return la < lb
	}
	if a.provider != b.provider {
		return a.provider < b.provider
	}
	return a.node < b.node
}

func (m *machine) release(t *rapid.T) {
	if len(m.leases) == 0 {
		t.Skip("no lease")
	}
	l := rapid.SampledFrom(m.leases).Draw(t, "lease")
	var ok bool
	if l.runID != "" && rapid.Bool().Draw(t, "byRun") {
		ok = m.s.ReleaseRun(l.runID, "terminal event")
	} else {
		ok = l.l.Release("explicit")
	}
	if ok == l.released {
		t.Fatalf("release returned %v for a lease released=%v", ok, l.released)
	}
	l.released = true
	m.collect(t)
}

func (m *machine) track(t *rapid.T) {
	live := m.live()
	if len(live) == 0 {
		t.Skip("no lease")
	}
	l := rapid.SampledFrom(live).Draw(t, "lease")
	if l.runID != "" {
		t.Skip("tracked")
	}
	m.runs++
	l.runID = fmt.Sprintf("run-%d", m.runs)
	l.l.Track(l.runID)
}

func (m *machine) cancel(t *rapid.T) {
	p := m.pending()
	if len(p) == 0 {
		t.Skip("no waiter")
	}
	w := rapid.SampledFrom(p).Draw(t, "waiter")
	if err := m.s.abandon(w.w, context.Canceled); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandon: %v", err)
	}
	w.done = true
	m.collect(t)
}

func (m *machine) advance(t *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 12).Draw(t, "seconds")) * time.Second
	m.clk.Advance(d)
	m.collect(t)
}

func (m *machine) connect(t *rapid.T) {
	n := rapid.SampledFrom(modelNodes).Draw(t, "node")
	node := m.nodes[n]
	m.gens++
	node.gen = m.gens
	node.connected = true
	var specs []ResourceSpec
	for _, p := range modelProviders {
		c := rapid.IntRange(1, 3).Draw(t, "capacity")
		lc := rapid.IntRange(0, c).Draw(t, "long")
		specs = append(specs, ResourceSpec{ProviderID: p, Capacity: c, LongCapacity: lc})
		node.capacity[p] = c
		node.long[p] = longOr(lc, c)
	}
	m.syncWorld()
	// A reconnect supersedes the old connection: its fence may come later.
	if err := m.s.Activate(n, node.gen, specs, func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	m.collect(t)
}

func (m *machine) disconnect(t *rapid.T) {
	n := rapid.SampledFrom(modelNodes).Draw(t, "node")
	node := m.nodes[n]
	if !node.connected {
		t.Skip("not connected")
	}
	whole := rapid.Bool().Draw(t, "whole")
	node.connected = false
	m.syncWorld()
	gen := node.gen
	if whole {
		gen = 0
	}
	m.s.Fence(n, gen)
	for _, l := range m.leases {
		if l.key.node == n && !l.released {
			if ok, _ := l.l.Released(); !ok {
				t.Fatalf("fence of %s left lease %v", n, l.key)
			}
			l.released = true
		}
	}
	m.collect(t)
}

func (m *machine) staleCallbacks(t *rapid.T) {
	n := rapid.SampledFrom(modelNodes).Draw(t, "node")
	node := m.nodes[n]
	if node.gen < 2 {
		t.Skip("no old generation")
	}
	old := uint64(rapid.IntRange(1, int(node.gen)-1).Draw(t, "old"))
	before := m.s.Snapshot().Providers
	// A reconnect may come before the old connection's fence: that fence
	// settles the old generation's leases and nothing else.
	m.s.Fence(n, old)
	for _, l := range m.leases {
		if l.key.node == n && l.l.Candidate().Generation <= old && !l.released {
			if ok, _ := l.l.Released(); !ok {
				t.Fatalf("fence of %s/%d left lease of generation %d", n, old, l.l.Candidate().Generation)
			}
			l.released = true
		}
	}
	if err := m.s.Activate(n, old, []ResourceSpec{{ProviderID: "pa", Capacity: 9}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.s.Activate(n, node.gen+100, []ResourceSpec{{ProviderID: "pa", Capacity: 9}}, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	after := m.s.Snapshot().Providers
	for i := range before {
		b, a := before[i], after[i]
		if b.NodeID == n && (a.Generation != b.Generation || a.Capacity != b.Capacity || a.LongCapacity != b.LongCapacity || a.Status != b.Status) {
			t.Fatalf("stale callbacks changed a resource:\n%+v\n%+v", b, a)
		}
	}
	m.collect(t)
}

func (m *machine) setCapacity(t *rapid.T) {
	n := rapid.SampledFrom(modelNodes).Draw(t, "node")
	node := m.nodes[n]
	if node.gen == 0 {
		t.Skip("never connected")
	}
	p := rapid.SampledFrom(modelProviders).Draw(t, "provider")
	c := rapid.IntRange(1, 3).Draw(t, "capacity")
	lc := rapid.IntRange(0, c).Draw(t, "long")
	if err := m.s.SetCapacity(n, p, c, lc); err != nil {
		t.Fatal(err)
	}
	node.capacity[p], node.long[p] = c, longOr(lc, c)
	m.collect(t)
}

func (m *machine) updatePolicy(t *rapid.T) {
	g := rapid.SampledFrom([]string{"g0", "g1", "g2"}).Draw(t, "group")
	p := Policy{
		MaxQueue:     rapid.IntRange(0, 4).Draw(t, "maxQueue"),
		QueueTimeout: time.Duration(rapid.IntRange(0, 20).Draw(t, "timeout")) * time.Second,
	}
	if err := m.s.UpdatePolicy(g, p); err != nil {
		t.Fatal(err)
	}
	m.policy[g] = m.policy[g].overlay(p)
}

// check runs after every step.
func (m *machine) check(t *rapid.T) {
	m.collect(t)
	snap := m.s.Snapshot()
	held, long := map[resourceKey]int{}, map[resourceKey]int{}
	for _, p := range snap.Providers {
		key := resourceKey{p.NodeID, p.ProviderID}
		if want := m.held(key, false); p.InFlight != want {
			t.Fatalf("%v in-flight %d, reference %d", key, p.InFlight, want)
		}
		if want := m.held(key, true); p.LongInFlight != want {
			t.Fatalf("%v long in-flight %d, reference %d", key, p.LongInFlight, want)
		}
		// Above capacity only after a capacity cut, and then only draining.
		if p.InFlight > p.Capacity && p.InFlight > m.lastHeld[key] {
			t.Fatalf("%v grew to %d above capacity %d", key, p.InFlight, p.Capacity)
		}
		if p.LongInFlight > p.LongCapacity && p.LongInFlight > m.lastLong[key] {
			t.Fatalf("%v long in-flight %d above %d", key, p.LongInFlight, p.LongCapacity)
		}
		held[key] = p.InFlight
		long[key] = p.LongInFlight
	}
	m.lastHeld, m.lastLong = held, long
	pend := m.pending()
	if snap.Waiters != len(pend) {
		t.Fatalf("scheduler has %d waiters, reference %d", snap.Waiters, len(pend))
	}
	for _, w := range pend {
		// No slot idle while a waiter that can use it waits.
		for _, k := range m.groupKeys(w.group) {
			if m.free(k, w.long) {
				t.Fatalf("waiter %d (%s long=%v) waits while %v is free", w.w.seq, w.group, w.long, k)
			}
		}
		if !m.clk.Now().Before(w.deadline) {
			t.Fatalf("waiter %d still queued past its deadline", w.w.seq)
		}
	}
	if snap.Leases != len(m.live()) {
		t.Fatalf("scheduler has %d leases, reference %d", snap.Leases, len(m.live()))
	}
}

func (m *machine) drain(t *rapid.T) {
	for _, w := range m.pending() {
		_ = m.s.abandon(w.w, context.Canceled)
		w.done = true
	}
	for _, l := range m.leases {
		l.l.Release("end")
		l.released = true
	}
	snap := m.s.Snapshot()
	if snap.Leases != 0 || snap.Waiters != 0 {
		t.Fatalf("leftovers at the end: %+v", snap)
	}
	for _, p := range snap.Providers {
		if p.InFlight != 0 || p.LongInFlight != 0 || p.Queued != 0 {
			t.Fatalf("counters not zero at the end: %+v", p)
		}
	}
	for _, g := range snap.Groups {
		if g.Queued != 0 {
			t.Fatalf("group not empty at the end: %+v", g)
		}
	}
	if n := m.clk.Pending(); n != 0 {
		t.Fatalf("%d queue timers left", n)
	}
}

func TestSchedulerModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newMachine(t)
		t.Repeat(map[string]func(*rapid.T){
			"admit":        m.admit,
			"admit2":       m.admit,
			"release":      m.release,
			"track":        m.track,
			"cancel":       m.cancel,
			"advance":      m.advance,
			"connect":      m.connect,
			"disconnect":   m.disconnect,
			"stale":        m.staleCallbacks,
			"setCapacity":  m.setCapacity,
			"updatePolicy": m.updatePolicy,
			"":             m.check,
		})
		m.drain(t)
	})
}
