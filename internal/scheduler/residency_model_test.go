package scheduler

import (
	"context"
	"testing"
	"time"

	"pgregory.net/rapid"

	"iop/internal/clock"
)

// rMachine drives a Scheduler with a residency policy through random
// admissions, releases, cancels, readings of what providers hold and
// clock steps, and checks after each step the invariants residency must
// keep: no provider above its capacity, each lease released once,
// nothing held beyond a configured limit, no request that needs no load
// waiting while a provider holding its model has a free slot, and a
// request left waiting beside a free provider only within its bounded
// wait for one that holds its model, or, where its load would evict a
// model, within MaxExtraWait.
type rMachine struct {
	clk     *clock.Fake
	s       *Scheduler
	pol     ResidencyPolicy
	caps    map[string]int
	limits  map[string]int
	models  map[string][]string // group → providers serving it
	waiters []*rWaiter
	leases  []*rLease
}

type rWaiter struct {
	w    *waiter
	done bool
}

type rLease struct {
	l        *Lease
	released bool
}

var (
	rProviders = []string{"a", "b", "c"}
	rModels    = []string{"x", "y", "z", "v"}
)

func newRMachine(t *rapid.T) *rMachine {
	clk := clock.NewFake(time.Unix(1000, 0))
	pol := ResidencyPolicy{
		MaxExtraWait: time.Duration(rapid.IntRange(1, 20).Draw(t, "maxExtraWait")) * time.Second,
		LoadTime:     time.Duration(rapid.IntRange(1, 10).Draw(t, "loadTime")) * time.Second,
	}
	s, err := New(Config{Clock: clk, Residency: &pol, Default: Policy{MaxQueue: 8, QueueTimeout: 30 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	m := &rMachine{clk: clk, s: s, pol: pol, caps: map[string]int{}, limits: map[string]int{}, models: map[string][]string{}}
	var specs []ResourceSpec
	for _, p := range rProviders {
		m.caps[p] = rapid.IntRange(1, 3).Draw(t, "capacity "+p)
		specs = append(specs, ResourceSpec{ProviderID: p, Capacity: m.caps[p]})
	}
	if err := s.Activate("n1", 1, specs, nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range rProviders {
		m.limits[p] = rapid.IntRange(0, 2).Draw(t, "maxLoaded "+p)
		if rapid.Bool().Draw(t, "read "+p) {
			if err := s.SetLoaded("n1", p, nil, m.limits[p]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, g := range rModels {
		ps := rapid.SliceOfNDistinct(rapid.SampledFrom(rProviders), 1, 3, rapid.ID[string]).Draw(t, "providers of "+g)
		m.models[g] = ps
	}
	return m
}

func (m *rMachine) resolver(group string) func() ([]Candidate, error) {
	return func() ([]Candidate, error) {
		var cs []Candidate
		for _, p := range m.models[group] {
			cs = append(cs, Candidate{NodeID: "n1", Generation: 1, ProviderID: p, Target: group})
		}
		return cs, nil
	}
}

func (m *rMachine) collect(t *rapid.T) {
	for _, w := range m.waiters {
		if w.done {
			continue
		}
		select {
		case r := <-w.w.ch:
			w.done = true
			if r.lease != nil {
				m.leases = append(m.leases, &rLease{l: r.lease})
			}
		default:
		}
	}
}

func (m *rMachine) admit(t *rapid.T) {
	g := rapid.SampledFrom(rModels).Draw(t, "group")
	lease, w, err := m.s.enqueue(Request{Group: g, Resolve: m.resolver(g)})
	switch {
	case lease != nil:
		m.leases = append(m.leases, &rLease{l: lease})
	case w != nil:
		m.waiters = append(m.waiters, &rWaiter{w: w})
	case err == nil:
		t.Fatal("enqueue: no lease, no waiter, no error")
	}
	m.collect(t)
}

func (m *rMachine) release(t *rapid.T) {
	var live []*rLease
	for _, l := range m.leases {
		if !l.released {
			live = append(live, l)
		}
	}
	if len(live) == 0 {
		t.Skip("no lease")
	}
	l := rapid.SampledFrom(live).Draw(t, "lease")
	if !l.l.Release("done") {
		t.Fatal("first release had no effect")
	}
	l.released = true
	if l.l.Release("again") {
		t.Fatal("second release had an effect")
	}
	m.collect(t)
}

func (m *rMachine) cancel(t *rapid.T) {
	var pend []*rWaiter
	for _, w := range m.waiters {
		if !w.done {
			pend = append(pend, w)
		}
	}
	if len(pend) == 0 {
		t.Skip("no waiter")
	}
	w := rapid.SampledFrom(pend).Draw(t, "waiter")
	_ = m.s.abandon(w.w, context.Canceled)
	w.done = true
	m.collect(t)
}

func (m *rMachine) read(t *rapid.T) {
	p := rapid.SampledFrom(rProviders).Draw(t, "provider")
	loaded := rapid.SliceOfNDistinct(rapid.SampledFrom(rModels), 0, 2, rapid.ID[string]).Draw(t, "loaded")
	if err := m.s.SetLoaded("n1", p, loaded, m.limits[p]); err != nil {
		t.Fatal(err)
	}
	m.collect(t)
}

func (m *rMachine) advance(t *rapid.T) {
	m.clk.Advance(time.Duration(rapid.IntRange(1, 12000).Draw(t, "ms")) * time.Millisecond)
	m.collect(t)
}

func (m *rMachine) check(t *rapid.T) {
	m.collect(t)
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	for _, p := range rProviders {
		r := m.s.resources[resourceKey{"n1", p}]
		if r.inFlight > r.capacity {
			t.Fatalf("%s: %d in flight above capacity %d", p, r.inFlight, r.capacity)
		}
		if r.held != nil && m.limits[p] > 0 && len(r.held.models) > m.limits[p] {
			t.Fatalf("%s holds %d models above its limit %d", p, len(r.held.models), m.limits[p])
		}
	}
	now := m.s.clock.Now()
	bound := min(m.pol.MaxExtraWait, m.pol.LoadTime)
	for w := m.s.head; w != nil; w = w.next {
		for _, c := range w.cands {
			if !c.res.fits(false) {
				continue
			}
			// Work conservation for requests that need no load.
			if c.res.holds(c.Target) {
				t.Fatalf("waiter %d (%s) waits while %s, holding it, is free", w.seq, w.group.name, c.ProviderID)
			}
			// Beside a free provider only while waiting for a holder, or,
			// when a load there would evict a model (with runs in flight,
			// or in more demand than its own), up to MaxExtraWait: a swap
			// waits for the runs of the model it evicts, and the demand of
			// that model decays between the events that reconsider it.
			waited := now.Sub(w.enqueued)
			if m.s.evictionCostLocked(c.res, c.Target, 0) != evictNothing {
				if w.swapWait == nil || waited >= m.pol.MaxExtraWait {
					t.Fatalf("waiter %d (%s) waits %v for a swap on %s", w.seq, w.group.name, waited, c.ProviderID)
				}
				continue
			}
			if w.hotWait == nil || waited >= bound {
				t.Fatalf("waiter %d (%s) waits %v while %s is free", w.seq, w.group.name, waited, c.ProviderID)
			}
		}
	}
}

func (m *rMachine) drain(t *rapid.T) {
	for _, w := range m.waiters {
		if !w.done {
			_ = m.s.abandon(w.w, context.Canceled)
			w.done = true
		}
	}
	m.collect(t)
	for _, l := range m.leases {
		if !l.released {
			l.l.Release("end")
			l.released = true
		}
	}
	m.collect(t)
	for _, w := range m.waiters {
		if !w.done {
			t.Fatal("waiter left")
		}
	}
	for _, l := range m.leases {
		if !l.released {
			l.l.Release("end")
		}
	}
	snap := m.s.Snapshot()
	if snap.Leases != 0 || snap.Waiters != 0 {
		t.Fatalf("leftovers at the end: %+v", snap)
	}
	for _, p := range snap.Providers {
		if p.InFlight != 0 || p.Queued != 0 {
			t.Fatalf("counters not zero at the end: %+v", p)
		}
	}
	if n := m.clk.Pending(); n != 0 {
		t.Fatalf("%d timers left", n)
	}
}

// TestResidencyModel checks the residency invariants (rMachine) over
// random runs.
func TestResidencyModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newRMachine(t)
		t.Repeat(map[string]func(*rapid.T){
			"admit":    m.admit,
			"admit2":   m.admit,
			"admit3":   m.admit,
			"release":  m.release,
			"release2": m.release,
			"cancel":   m.cancel,
			"read":     m.read,
			"advance":  m.advance,
			"":         m.check,
		})
		m.drain(t)
	})
}
