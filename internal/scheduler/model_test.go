package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"iop/internal/clock"
)

// Actions call rapid's (*rapid.T).Skip when their precondition does not
// hold (no lease to release, no waiter to cancel, ...): that skips the one
// action and rapid draws another; it never skips the test.
//
// The model-based property test: random sequences of admit (with and
// without a capability need that only some providers meet), cancel, clock
// advance, track, release (by lease and by run id, duplicates included),
// connect and reconnect (a new generation, with a random subset of the
// node's providers and of their capabilities: providers dropped from a
// reconnect Hello), disconnect (current generation or the whole node),
// stale callbacks (fence and activate of an old generation, activate of a
// non-owner), capacity changes (cuts included), policy changes, and
// resolvers that fail transiently and recover. After every step it checks
// the scheduler against a plain reference model of the world:
//
//   - counters: in-flight and long in-flight per resource, waiters, leases;
//     no resource above its capacity except draining after a cut;
//   - the resources the scheduler holds: exactly those of current
//     connections plus orphans that still hold a lease (a drained orphan is
//     removed), with their status and generation;
//   - work conservation: no resource has a free slot while a queued waiter
//     lists it (with a live candidate on it), and a fresh admission never
//     takes a slot an earlier waiter listing it could use;
//   - order: a waiter handed a slot never overtakes an earlier one, still
//     waiting, that lists the same resource;
//   - outcomes: every settled waiter's outcome is the one the reference
//     predicts (a lease only on a candidate it lists; ErrQueueTimeout only
//     at its deadline; ErrProviderUnavailable, never ErrCandidatesRejected,
//     exactly when its re-resolution finds no candidate left), and every
//     predicted failure has happened.
//
// The reference re-resolves waiters when the scheduler's contract says it
// does (resolveLocked, retryStaleLocked): every waiter at an Activate or a
// Fence that changed something; waiters whose resolver failed at their last
// resolution ("stale" ones) also at every admission, effective release and
// capacity change. A resolver that fails leaves a waiter queued with the
// candidates it had that are still live.

var (
	modelNodes     = []string{"n0", "n1"}
	modelProviders = []string{"pa", "pb"}
	modelGroupList = []string{"g0", "g1", "g2"}
	// Each group lists some (node-independent) providers; a candidate exists
	// on every connected node for each listed provider that node's current
	// connection has.
	modelGroups = map[string][]string{"g0": {"pa"}, "g1": {"pb"}, "g2": {"pa", "pb"}}
	// errTransient is a resolver fault that is none of the scheduler's
	// sentinels: it leaves a queued waiter queued.
	errTransient = errors.New("catalog unavailable")
)

type mNode struct {
	gen       uint64 // current generation; 0 = never connected
	connected bool
	providers map[string]bool // in the current connection's Hello
	tools     map[string]bool // providers of the current connection with the capability "tools"
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

// mCand is one candidate as the reference sees it.
type mCand struct {
	key resourceKey
	gen uint64
}

type mWaiter struct {
	w        *waiter
	group    string
	long     bool
	tools    bool // needs providers with "tools"
	deadline time.Time
	done     bool
	key      resourceKey // resource it was handed, if any
	// What the reference says the scheduler holds for it.
	cands []mCand // its live candidates
	stale bool    // its last resolution failed
	// expect, when set, is the error it must have failed with by now.
	expect error
	// lostUntil, when set, is the end of its reconnect grace: it lost
	// every candidate and fails with ErrProviderUnavailable then, unless a
	// re-resolution finds one first.
	lostUntil time.Time
}

type machine struct {
	clk     *clock.Fake
	s       *Scheduler
	nodes   map[string]*mNode
	failing map[string]bool // groups whose resolver fails now
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
	grace := rapid.SampledFrom([]time.Duration{0, 3 * time.Second, 7 * time.Second}).Draw(t, "reconnectGrace")
	s, err := New(Config{Default: Policy{MaxQueue: 3, QueueTimeout: 10 * time.Second, ReconnectGrace: grace}, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	m := &machine{clk: clk, s: s, nodes: map[string]*mNode{}, failing: map[string]bool{},
		lastHeld: map[resourceKey]int{}, lastLong: map[resourceKey]int{}}
	for _, n := range modelNodes {
		m.nodes[n] = &mNode{providers: map[string]bool{}, tools: map[string]bool{}, capacity: map[string]int{}, long: map[string]int{}}
	}
	m.policy = map[string]Policy{}
	for g := range modelGroups {
		m.policy[g] = Policy{MaxQueue: 3, QueueTimeout: 10 * time.Second, ReconnectGrace: grace}
	}
	return m
}

// world returns the candidates of a request of group on current
// connections, and those of them that meet its need, in the catalog's
// order (node, then provider).
func (m *machine) world(group string, tools bool) (all, ok []mCand) {
	for _, n := range modelNodes {
		node := m.nodes[n]
		if !node.connected {
			continue
		}
		for _, p := range modelGroups[group] {
			if !node.providers[p] {
				continue
			}
			c := mCand{resourceKey{n, p}, node.gen}
			all = append(all, c)
			if !tools || node.tools[p] {
				ok = append(ok, c)
			}
		}
	}
	return all, ok
}

// resolve is the reference resolver: the request's candidates, or the
// error a catalog gives.
func (m *machine) resolve(group string, tools bool) ([]mCand, error) {
	if m.failing[group] {
		return nil, errTransient
	}
	all, ok := m.world(group, tools)
	switch {
	case len(all) == 0:
		return nil, fmt.Errorf("%w %q", ErrNoProvider, group)
	case len(ok) == 0:
		return nil, fmt.Errorf("%w: no provider of %q has tools", ErrCandidatesRejected, group)
	}
	return ok, nil
}

// resolver is the request's resolver given to the scheduler: the reference
// resolver, in the scheduler's types.
func (m *machine) resolver(group string, tools bool) func() ([]Candidate, error) {
	return func() ([]Candidate, error) {
		cands, err := m.resolve(group, tools)
		if err != nil {
			return nil, err
		}
		out := make([]Candidate, len(cands))
		for i, c := range cands {
			out[i] = cand(c.key.node, c.gen, c.key.provider)
		}
		return out, nil
	}
}

// liveCand reports whether c is a candidate on a current connection.
func (m *machine) liveCand(c mCand) bool {
	node := m.nodes[c.key.node]
	return node.connected && node.gen == c.gen && node.providers[c.key.provider]
}

// reresolve applies one re-resolution of w in the reference.
func (m *machine) reresolve(w *mWaiter) {
	if w.done || w.expect != nil {
		return
	}
	cands, err := m.resolve(w.group, w.tools)
	switch {
	case errors.Is(err, errTransient):
		w.cands = slices.DeleteFunc(w.cands, func(c mCand) bool { return !m.liveCand(c) })
		w.stale = true
	case err != nil:
		grace := m.policy[w.group].ReconnectGrace
		if grace <= 0 {
			w.expect = ErrProviderUnavailable
			return
		}
		// Queued without a candidate, stale, until its grace ends.
		w.cands, w.stale = nil, true
		if w.lostUntil.IsZero() {
			w.lostUntil = m.clk.Now().Add(grace)
		}
	default:
		w.cands, w.stale, w.lostUntil = cands, false, time.Time{}
	}
}

// graceOver reports whether w's reconnect grace has ended.
func (m *machine) graceOver(w *mWaiter) bool {
	return !w.lostUntil.IsZero() && !m.clk.Now().Before(w.lostUntil)
}

// reresolveAll is what an Activate or a Fence that changed something does.
func (m *machine) reresolveAll() {
	for _, w := range m.waiters {
		m.reresolve(w)
	}
}

// retryStale is what an admission, an effective release or a capacity
// change does first.
func (m *machine) retryStale() {
	for _, w := range m.waiters {
		if w.stale {
			m.reresolve(w)
		}
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

// liveKey reports whether key is a provider of a current connection.
func (m *machine) liveKey(key resourceKey) bool {
	node := m.nodes[key.node]
	return node.connected && node.providers[key.provider]
}

// exists reports whether the scheduler must hold a resource for key: a
// provider of a current connection, or an orphan that still has a lease.
func (m *machine) exists(key resourceKey) bool {
	return m.liveKey(key) || m.held(key, false) > 0
}

// free reports whether the reference model has a slot for a request on key.
func (m *machine) free(key resourceKey, long bool) bool {
	if !m.liveKey(key) {
		return false
	}
	node := m.nodes[key.node]
	if m.held(key, false) >= node.capacity[key.provider] {
		return false
	}
	return !long || m.held(key, true) < node.long[key.provider]
}

func (w *mWaiter) lists(key resourceKey, gen uint64) bool {
	return slices.Contains(w.cands, mCand{key, gen})
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
				c := r.lease.Candidate()
				key := resourceKey{c.NodeID, c.ProviderID}
				if w.expect != nil {
					t.Fatalf("waiter %d got a lease on %v; the reference expects %v", w.w.seq, key, w.expect)
				}
				if !w.lists(key, c.Generation) {
					t.Fatalf("waiter %d got %v generation %d, not one of its candidates %v", w.w.seq, key, c.Generation, w.cands)
				}
				m.leases = append(m.leases, &mLease{l: r.lease, key: key, long: w.long})
				served = append(served, w)
				w.key = key
				if r.lease.Info().QueueReason != ReasonQueued {
					t.Fatalf("handed-over lease has reason %q", r.lease.Info().QueueReason)
				}
			case errors.Is(r.err, ErrQueueTimeout):
				if m.clk.Now().Before(w.deadline) {
					t.Fatalf("timed out at %v before its deadline %v", m.clk.Now(), w.deadline)
				}
				if w.expect != nil {
					t.Fatalf("waiter %d timed out; the reference expects %v", w.w.seq, w.expect)
				}
			case errors.Is(r.err, ErrProviderUnavailable):
				if !errors.Is(w.expect, ErrProviderUnavailable) && !m.graceOver(w) {
					t.Fatalf("waiter %d failed with %v; the reference expects %v (candidates %v)", w.w.seq, r.err, w.expect, w.cands)
				}
				if errors.Is(r.err, ErrCandidatesRejected) {
					t.Fatalf("waiter %d failed with %v: a lost provider is no rejection", w.w.seq, r.err)
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
			for _, c := range e.cands {
				if c.key == w.key {
					t.Fatalf("waiter %d got %v before earlier waiter %d", w.w.seq, c.key, e.w.seq)
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
	group := rapid.SampledFrom(modelGroupList).Draw(t, "group")
	long := rapid.Bool().Draw(t, "long")
	tools := rapid.Bool().Draw(t, "tools")
	// Half the admissions bring an affinity (prefix-cache-aware routing):
	// expected cached tokens per provider id, and a load weight.
	var affinity map[string]int
	slack := 0.0
	if rapid.Bool().Draw(t, "affine") {
		affinity = map[string]int{}
		for _, p := range modelProviders {
			affinity[p] = rapid.SampledFrom([]int{0, 0, 16, 512, 4096}).Draw(t, "affinity "+p)
		}
		slack = rapid.SampledFrom([]float64{0, 0.25, 0.5, 1}).Draw(t, "slack")
	}
	req := Request{Group: group, Long: long, Resolve: m.resolver(group, tools), AffinitySlack: slack}
	if affinity != nil {
		req.Affinity = func(c Candidate) int { return affinity[c.ProviderID] }
	}
	// An admission first retries the stale waiters; those it hands a slot
	// come before this request.
	m.retryStale()
	lease, w, err := m.s.enqueue(req)
	m.collect(t)
	// What the reference expects, in the state the earlier waiters left:
	// the least loaded free candidate (refLess); with an affinity, the one
	// of highest affinity among the free ones whose load is within the
	// slack of that one's (in exact rational arithmetic), ties by refLess.
	cands, rerr := m.resolve(group, tools)
	var want *resourceKey
	for _, c := range cands {
		if m.free(c.key, long) && (want == nil || refLess(m, c.key, *want)) {
			k := c.key
			want = &k
		}
	}
	if affinity != nil && want != nil {
		load := func(k resourceKey) *big.Rat {
			return big.NewRat(int64(m.held(k, false)), int64(m.nodes[k.node].capacity[k.provider]))
		}
		limit := new(big.Rat).Add(load(*want), new(big.Rat).SetFloat64(slack))
		best := *want
		for _, c := range cands {
			if !m.free(c.key, long) || load(c.key).Cmp(limit) > 0 {
				continue
			}
			a, b := affinity[c.key.provider], affinity[best.provider]
			if a > b || (a == b && refLess(m, c.key, best)) {
				best = c.key
			}
		}
		want = &best
	}
	queued := 0
	for _, w := range m.pending() {
		if w.group == group {
			queued++
		}
	}
	maxQueue, timeout := m.policy[group].MaxQueue, m.policy[group].QueueTimeout
	switch {
	case rerr != nil:
		// At arrival the resolver's error is the answer (a rejection stays
		// one: no provider can take this request).
		if kind := errKind(rerr); !errors.Is(err, kind) {
			t.Fatalf("resolver says %v: got %v %v %v", rerr, lease, w, err)
		}
		if lease != nil || w != nil {
			t.Fatalf("resolver error %v but admitted", rerr)
		}
	case want != nil:
		if err != nil || lease == nil {
			t.Fatalf("free slot on %v but got %v %v", *want, w, err)
		}
		if lease.res.key != *want {
			t.Fatalf("picked %v, reference picks %v", lease.res.key, *want)
		}
		// No earlier waiter that lists the slot and could use it waits.
		for _, e := range m.pending() {
			if e.lists(lease.res.key, lease.Candidate().Generation) && m.free(lease.res.key, e.long) {
				t.Fatalf("admission took %v ahead of waiter %d that lists it", lease.res.key, e.w.seq)
			}
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
		m.waiters = append(m.waiters, &mWaiter{w: w, group: group, long: long, tools: tools, cands: cands,
			deadline: m.clk.Now().Add(timeout)})
	}
}

// errKind returns the sentinel err wraps.
func errKind(err error) error {
	for _, k := range []error{errTransient, ErrNoProvider, ErrCandidatesRejected} {
		if errors.Is(err, k) {
			return k
		}
	}
	return err
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
	if ok {
		m.retryStale()
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
	if w.expect != nil {
		t.Skip("settled")
	}
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

// failResolver makes a group's resolver fail transiently; recoverResolver
// ends it. Neither tells the scheduler: it finds out when it re-resolves.
func (m *machine) failResolver(t *rapid.T) {
	m.failing[rapid.SampledFrom(modelGroupList).Draw(t, "group")] = true
}

func (m *machine) recoverResolver(t *rapid.T) {
	var failing []string
	for _, g := range modelGroupList {
		if m.failing[g] {
			failing = append(failing, g)
		}
	}
	if len(failing) == 0 {
		t.Skip("no resolver fails")
	}
	m.failing[rapid.SampledFrom(failing).Draw(t, "group")] = false
}

func (m *machine) connect(t *rapid.T) {
	n := rapid.SampledFrom(modelNodes).Draw(t, "node")
	node := m.nodes[n]
	m.gens++
	node.gen = m.gens
	node.connected = true
	// A reconnect's Hello may drop providers the last one had, and change
	// their capabilities.
	subset := rapid.SliceOfNDistinct(rapid.SampledFrom(modelProviders), 1, len(modelProviders), rapid.ID[string]).Draw(t, "providers")
	clear(node.providers)
	clear(node.tools)
	var specs []ResourceSpec
	for _, p := range subset {
		c := rapid.IntRange(1, 2).Draw(t, "capacity")
		lc := rapid.IntRange(0, c).Draw(t, "long")
		specs = append(specs, ResourceSpec{ProviderID: p, Capacity: c, LongCapacity: lc})
		node.providers[p] = true
		node.tools[p] = rapid.Bool().Draw(t, "tools")
		node.capacity[p] = c
		node.long[p] = longOr(lc, c)
	}
	// A reconnect supersedes the old connection: its fence may come later.
	if err := m.s.Activate(n, node.gen, specs, func() bool { return true }); err != nil {
		t.Fatal(err)
	}
	m.reresolveAll()
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
	m.reresolveAll()
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
	changed := false
	for _, l := range m.leases {
		if l.key.node == n && l.l.Candidate().Generation <= old && !l.released {
			if ok, _ := l.l.Released(); !ok {
				t.Fatalf("fence of %s/%d left lease of generation %d", n, old, l.l.Candidate().Generation)
			}
			l.released = true
			changed = true
		}
	}
	if changed {
		m.reresolveAll()
	}
	m.collect(t)
	// A late activation of an old generation changes nothing: the
	// scheduler refuses it itself while it holds resources of a newer one
	// of the node; once it holds none (the node gone and drained) only the
	// caller's ownership check can tell, as the edge's does.
	owner := func() bool { return false }
	for _, p := range modelProviders {
		if m.exists(resourceKey{n, p}) {
			owner = nil
		}
	}
	if err := m.s.Activate(n, old, []ResourceSpec{{ProviderID: "pa", Capacity: 9}}, owner); err != nil {
		t.Fatal(err)
	}
	if err := m.s.Activate(n, node.gen+100, []ResourceSpec{{ProviderID: "pa", Capacity: 9}}, func() bool { return false }); err != nil {
		t.Fatal(err)
	}
	after := m.s.Snapshot().Providers
	for _, a := range after {
		if a.NodeID != n {
			continue
		}
		i := slices.IndexFunc(before, func(b ProviderSnapshot) bool { return b.NodeID == a.NodeID && b.ProviderID == a.ProviderID })
		if i < 0 {
			t.Fatalf("stale callbacks created a resource: %+v", a)
		}
		if b := before[i]; a.Generation != b.Generation || a.Capacity != b.Capacity || a.LongCapacity != b.LongCapacity || a.Status != b.Status {
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
	c := rapid.IntRange(1, 2).Draw(t, "capacity")
	lc := rapid.IntRange(0, c).Draw(t, "long")
	err := m.s.SetCapacity(n, p, c, lc)
	if !m.exists(resourceKey{n, p}) {
		if !errors.Is(err, ErrUnknownResource) {
			t.Fatalf("capacity of %s/%s, which the scheduler must have forgotten: %v", n, p, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	node.capacity[p], node.long[p] = c, longOr(lc, c)
	m.retryStale()
	m.collect(t)
}

func (m *machine) updatePolicy(t *rapid.T) {
	g := rapid.SampledFrom(modelGroupList).Draw(t, "group")
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
		if !m.exists(key) {
			t.Fatalf("%v is neither a provider of a current connection nor an orphan with a lease: %+v", key, p)
		}
		wantStatus := StatusOrphan
		if m.liveKey(key) {
			wantStatus = StatusAvailable
			if p.Generation != m.nodes[key.node].gen {
				t.Fatalf("%v has generation %d, its node %d", key, p.Generation, m.nodes[key.node].gen)
			}
		}
		if p.Status != wantStatus {
			t.Fatalf("%v status %q, reference %q", key, p.Status, wantStatus)
		}
		// A waiter is listed on a resource exactly while it has a live
		// candidate there.
		listing := 0
		for _, w := range m.pending() {
			if slices.ContainsFunc(w.cands, func(c mCand) bool { return c.key == key && m.liveCand(c) }) {
				listing++
			}
		}
		if p.Queued != listing {
			t.Fatalf("%v lists %d waiters, reference %d", key, p.Queued, listing)
		}
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
	for _, n := range modelNodes {
		for _, p := range modelProviders {
			if key := (resourceKey{n, p}); m.exists(key) && !slices.ContainsFunc(snap.Providers, func(s ProviderSnapshot) bool {
				return s.NodeID == n && s.ProviderID == p
			}) {
				t.Fatalf("%v missing from the snapshot", key)
			}
		}
	}
	m.lastHeld, m.lastLong = held, long
	pend := m.pending()
	if snap.Waiters != len(pend) {
		t.Fatalf("scheduler has %d waiters, reference %d", snap.Waiters, len(pend))
	}
	for _, w := range pend {
		if w.expect != nil {
			t.Fatalf("waiter %d still queued; the reference expects it failed with %v", w.w.seq, w.expect)
		}
		// No slot idle while a waiter that lists it waits.
		for _, c := range w.cands {
			if !m.liveCand(c) {
				t.Fatalf("reference: waiter %d lists dead candidate %v", w.w.seq, c)
			}
			if m.free(c.key, w.long) {
				t.Fatalf("waiter %d (%s long=%v tools=%v stale=%v) waits while %v is free", w.w.seq, w.group, w.long, w.tools, w.stale, c.key)
			}
		}
		if !m.clk.Now().Before(w.deadline) {
			t.Fatalf("waiter %d still queued past its deadline", w.w.seq)
		}
		if m.graceOver(w) {
			t.Fatalf("waiter %d still queued past its reconnect grace (%v)", w.w.seq, w.lostUntil)
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
		if !m.liveKey(resourceKey{p.NodeID, p.ProviderID}) {
			t.Fatalf("drained orphan left at the end: %+v", p)
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
		actions := map[string]func(*rapid.T){
			"admit":           m.admit,
			"admit2":          m.admit,
			"admit3":          m.admit,
			"admit4":          m.admit,
			"release":         m.release,
			"release2":        m.release,
			"track":           m.track,
			"cancel":          m.cancel,
			"advance":         m.advance,
			"connect":         m.connect,
			"connect2":        m.connect,
			"disconnect":      m.disconnect,
			"stale":           m.staleCallbacks,
			"setCapacity":     m.setCapacity,
			"updatePolicy":    m.updatePolicy,
			"failResolver":    m.failResolver,
			"recoverResolver": m.recoverResolver,
			"recoverResolve2": m.recoverResolver,
			"":                m.check,
		}
		// Runs of about 4 × rapid.steps actions: the defects this test is
		// for need a queue, a resolver fault and a reconnect in one run.
		for range 4 {
			t.Repeat(actions)
		}
		m.drain(t)
	})
}
