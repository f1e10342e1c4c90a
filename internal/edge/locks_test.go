package edge

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// within runs f on its own goroutine and fails the test, with every
// goroutine's stack, when f has not returned within the failsafe: the sign
// of a lock taken where the lock order forbids it (package doc,
// "Concurrency").
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(failsafe):
		buf := make([]byte, 1<<20)
		t.Fatalf("%s did not complete: a lock held elsewhere blocks it\n%s", what, buf[:runtime.Stack(buf, true)])
	}
}

// TestAdmissionDoesNotWaitForARegistryWriter: a registry writer stuck
// mid-update (holding registry.mu: a connect, fence, provider update,
// drain or forget) does not stop a request to a model from being
// resolved, admitted, dispatched, answered and ended, nor the snapshots
// and model lists from being read: the resolvers the scheduler calls
// under its lock, and every other reader, read the registry's published
// state and take no lock (package doc, "Concurrency"). A resolver that
// took registry.mu under the scheduler's lock would make the request wait
// for the writer, and every other admission for the scheduler's lock.
func TestAdmissionDoesNotWaitForARegistryWriter(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p", normalized, 2, "m-big")))

	e.svc.reg.mu.Lock() // a writer, mid-update
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			e.svc.reg.mu.Unlock()
		}
	}
	t.Cleanup(unlock) // before the edge stops

	for _, model := range []string{"m-big", "chat"} { // a served name, an alias
		run, rs, d := e.startRun(t, n, chatReq(model))
		if d.GetServedModel() != "m-big" || run.Info().ProviderID != "p" {
			t.Fatalf("%s: dispatched %v, want m-big on p", model, d)
		}
		sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "hi"), &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}))
		within(t, "reading the run to its end", func() {
			if _, err := recvAll(run); err == nil {
				t.Errorf("%s: Recv ended without an error, want io.EOF", model)
			}
		})
		run.Close("test")
	}
	within(t, "reading snapshots and models", func() {
		if p, ok := providerOf(e.svc.Snapshot(), "n1", "p"); !ok || p.InFlight != 0 {
			t.Errorf("snapshot: %+v, %v; want p with nothing in flight", p, ok)
		}
		if !slices.Contains(e.svc.Models(), "m-big") || !e.svc.Known("m-big") {
			t.Errorf("models %v: m-big missing", e.svc.Models())
		}
		if info, ok := e.svc.ModelInfo("chat"); !ok || len(info.Providers) != 1 {
			t.Errorf("ModelInfo(chat) = %+v, %v; want its one provider", info, ok)
		}
	})
	unlock()
}

// TestSchedulerCallbacksTakeNoEdgeLock: with the registry's and the
// circuit breakers' locks held by others, every callback the scheduler
// runs under its own lock completes: the resolver at admission, the
// re-resolution of a queued request and the ownership check at Activate,
// and the hand-over of a released slot to that request. So no edge lock
// nests inside the scheduler's (package doc, "Concurrency").
func TestSchedulerCallbacksTakeNoEdgeLock(t *testing.T) {
	e := startEdge(t, testConfig())
	e.connect(t, hello("n1", prov("p", normalized, 1, "m-big")))
	c := e.svc.reg.current("n1")
	specs := e.svc.reg.specs(c)

	e.svc.reg.mu.Lock()
	e.svc.breakers.mu.Lock()
	var once sync.Once
	unlock := func() {
		once.Do(func() {
			e.svc.breakers.mu.Unlock()
			e.svc.reg.mu.Unlock()
		})
	}
	t.Cleanup(unlock)

	req := scheduler.Request{Group: "chat", Resolve: e.svc.resolver("chat", needsOf(chatReq("chat")), nil)}
	var first *scheduler.Lease
	within(t, "an admission with a free slot", func() {
		var err error
		if first, err = e.svc.sched.Admit(context.Background(), req); err != nil {
			t.Errorf("Admit: %v", err)
		}
	})
	if first == nil {
		t.FailNow()
	}
	queued := make(chan error, 1)
	go func() {
		l, err := e.svc.sched.Admit(context.Background(), req)
		if err == nil {
			if l.Candidate().ProviderID != "p" {
				err = fmt.Errorf("granted %+v, want p", l.Candidate())
			}
			l.Release("test")
		}
		queued <- err
	}()
	waitFor(t, func() bool { return e.svc.sched.Snapshot().Waiters == 1 })
	within(t, "an Activate that re-resolves the queued request", func() {
		if err := e.svc.sched.Activate(c.nodeID, c.gen, specs, func() bool { return e.svc.reg.isCurrent(c) }); err != nil {
			t.Errorf("Activate: %v", err)
		}
	})
	within(t, "a release that hands the slot over", func() { first.Release("test") })
	within(t, "the queued request's admission", func() {
		if err := <-queued; err != nil {
			t.Errorf("queued request: %v", err)
		}
	})
	unlock()
}

// TestBreakerOpeningWhileResolvingNeitherDeadlocksNorRaces: a provider's
// circuit opens, cools down and closes again, round after round (each
// change re-activating the node in the scheduler, as a run's end does),
// while requests are resolved, queued and admitted to the model it
// serves with another provider. Nothing deadlocks, the race detector
// finds nothing, and no request whose admission ran wholly while the
// circuit was open goes to that provider (breakers: an open circuit
// takes its provider out of the resolver's candidates).
func TestBreakerOpeningWhileResolvingNeitherDeadlocksNorRaces(t *testing.T) {
	const coolDown = 11 * time.Second // no other timer of the test config has it
	cfg := testConfig()
	cfg.CircuitBreaker = BreakerConfig{Failures: 1, CoolDown: coolDown, MaxCoolDown: coolDown}
	cfg.Queue.QueueTimeout = 24 * time.Hour // the rounds advance the clock
	e := startEdge(t, cfg)
	e.connect(t, hello("n1", prov("flaky", normalized, 1, "m-big"), prov("steady", normalized, 1, "m-big")))
	flaky := providerKey{"n1", "flaky"}

	// epoch is odd while the circuit is open: it turns odd after the
	// circuit opened, and even again before its cool-down may end.
	var epoch, admitted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const workers = 4
	for w := range workers {
		wg.Go(func() {
			resolve := e.svc.resolver("chat", needsOf(chatReq("chat")), nil)
			for {
				select {
				case <-stop:
					return
				default:
				}
				e1 := epoch.Load()
				l, err := e.svc.sched.Admit(context.Background(), scheduler.Request{Group: "chat", Resolve: resolve})
				e2 := epoch.Load()
				if err != nil {
					t.Errorf("worker %d: Admit: %v", w, err)
					return
				}
				if e1 == e2 && e1%2 == 1 && l.Candidate().ProviderID == flaky.provider {
					t.Errorf("worker %d: admitted to %s while its circuit was open (epoch %d)", w, flaky.provider, e1)
				}
				admitted.Add(1)
				if rand.N(4) == 0 {
					runtime.Gosched()
				}
				l.Release("test")
			}
		})
	}
	waitAdmitted := func(more int64) {
		t.Helper()
		target := admitted.Load() + more
		waitFor(t, func() bool { return admitted.Load() >= target || t.Failed() })
	}

	within(t, "the circuit rounds", func() {
		for round := range 30 {
			tk, ok := e.svc.breakers.acquire(flaky)
			if !ok {
				t.Errorf("round %d: %s out of rotation before it failed", round, flaky.provider)
				return
			}
			if !tk.done(outcomeFailed) {
				t.Errorf("round %d: a failure did not open the circuit (Failures 1)", round)
				return
			}
			e.svc.circuitOpened(flaky)
			epoch.Add(1)
			if got := e.svc.breakers.state(flaky); got != CircuitOpen {
				t.Errorf("round %d: circuit %s, want open", round, got)
			}
			waitAdmitted(8)
			epoch.Add(1)
			e.clk.Advance(coolDown) // half-open; its timer re-resolves the queued requests
			trial, ok := e.svc.breakers.acquire(flaky)
			if !ok {
				t.Errorf("round %d: no trial after the cool-down", round)
				return
			}
			trial.done(outcomeOK) // closes it; back in rotation
			waitAdmitted(8)
		}
	})
	close(stop)
	within(t, "the workers' end", wg.Wait)
	if got := e.svc.breakers.state(flaky); got != CircuitClosed {
		t.Fatalf("circuit %s after its last trial succeeded, want closed", got)
	}
}

// describeState renders everything a reader can see of a registry state,
// to compare a state with itself later.
func describeState(st *regState) string {
	var b strings.Builder
	conn := func(cs *connState) {
		fmt.Fprintf(&b, " %s/%d draining=%v:", cs.c.nodeID, cs.c.gen, cs.draining)
		for _, p := range cs.providers {
			fmt.Fprintf(&b, " %s healthy=%v cap=%d/%d models=%v own=%d", p.id, p.healthy, p.capacity, p.longCapacity, p.models, len(p.model))
			if cs.byID[p.id] != p {
				b.WriteString(" (byID differs)")
			}
		}
	}
	sorted := func(names func(func(string) bool)) []string { return slices.Sorted(names) }
	for _, id := range sorted(func(y func(string) bool) {
		for k := range st.nodes.all() {
			y(k)
		}
	}) {
		cs, _ := st.nodes.get(id)
		b.WriteString("node")
		conn(cs)
		b.WriteString("\n")
	}
	for _, m := range sorted(func(y func(string) bool) {
		for k := range st.served.all() {
			y(k)
		}
	}) {
		l, _ := st.served.get(m)
		fmt.Fprintf(&b, "served %s:", m)
		for _, s := range l {
			fmt.Fprintf(&b, " %s/%d/%s healthy=%v draining=%v", s.cs.c.nodeID, s.cs.c.gen, s.p.id, s.p.healthy, s.cs.draining)
		}
		b.WriteString("\n")
	}
	for _, m := range sorted(func(y func(string) bool) {
		for k := range st.lastServed.all() {
			y(k)
		}
	}) {
		at, _ := st.lastServed.get(m)
		fmt.Fprintf(&b, "last served %s %s\n", m, at)
	}
	for _, id := range sorted(func(y func(string) bool) {
		for k := range st.gone.all() {
			y(k)
		}
	}) {
		g, _ := st.gone.get(id)
		fmt.Fprintf(&b, "gone %s:", g.at)
		conn(g.cs)
		b.WriteString("\n")
	}
	return b.String()
}

// TestRegistryStateIsNeverModifiedOncePublished: a state a reader loaded
// says the same after every kind of writer ran (connect, provider update
// of health, capacity and models, drain, fence, reconnect, forget); each
// writer's change shows in the state published after it. Readers hold no
// lock, so a writer that modified a published state in place would change
// what a resolver is reading (package doc, "Concurrency").
func TestRegistryStateIsNeverModifiedOncePublished(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := newRegistry(func() time.Time { return now })
	mustHello := func(h *nodev1.Hello) *conn {
		c, err := parseHello(h, now)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var states []*regState
	var seen []string
	step := func(what string, want func(*regState) bool) {
		t.Helper()
		st := reg.load()
		if len(states) > 0 && st == states[len(states)-1] {
			t.Fatalf("%s: published no new state", what)
		}
		if !want(st) {
			t.Fatalf("%s: state does not show it:\n%s", what, describeState(st))
		}
		for i, old := range states {
			if got := describeState(old); got != seen[i] {
				t.Fatalf("%s: the state published after step %d changed:\nwas\n%s\nis\n%s", what, i, seen[i], got)
			}
		}
		states, seen = append(states, st), append(seen, describeState(st))
	}
	served := func(st *regState, m string) []servedBy { l, _ := st.served.get(m); return l }

	a := mustHello(hello("a", prov("p", normalized, 1, "m1", "m2"), prov("q", tunnel, 2, "m2")))
	reg.add(a)
	step("connect a", func(st *regState) bool { return len(served(st, "m2")) == 2 && st.current("a").c == a })
	b := mustHello(hello("b", prov("p", normalized, 1, "m2")))
	reg.add(b)
	step("connect b", func(st *regState) bool { return len(served(st, "m2")) == 3 })
	if _, ok := reg.update(a, &nodev1.ProviderUpdate{ProviderId: "p", Healthy: false, Capacity: 3}); !ok {
		t.Fatal("health update refused")
	}
	step("a/p unhealthy, capacity 3", func(st *regState) bool {
		p := st.current("a").byID["p"]
		return !p.healthy && p.capacity == 3 && served(st, "m1")[0].p == p
	})
	if _, ok := reg.update(a, &nodev1.ProviderUpdate{ProviderId: "q", Healthy: true, ModelsSet: true, Models: []string{"m3"},
		ModelCapabilities: []*nodev1.ModelCapabilities{{Model: "m3", Capabilities: []string{"completion"}}}}); !ok {
		t.Fatal("models update refused")
	}
	step("a/q serves m3 only", func(st *regState) bool {
		return len(served(st, "m3")) == 1 && len(served(st, "m2")) == 2 && st.current("a").byID["q"].model["m3"] != nil
	})
	if !reg.drain(b) {
		t.Fatal("drain refused")
	}
	step("b draining", func(st *regState) bool {
		l := served(st, "m2")
		return st.current("b").draining && l[len(l)-1].cs.draining && !l[0].cs.draining
	})
	now = now.Add(time.Minute)
	reg.remove(b)
	step("b gone", func(st *regState) bool {
		g, ok := st.gone.get("b")
		return ok && st.current("b") == nil && g.cs.draining && len(served(st, "m2")) == 1
	})
	reg.remove(a)
	step("a gone", func(st *regState) bool {
		_, ok := st.lastServed.get("m1")
		return ok && st.nodes.len() == 0 && st.served.len() == 0 && st.known("m3")
	})
	a2 := mustHello(hello("a", prov("p", normalized, 1, "m1")))
	reg.add(a2)
	step("a again", func(st *regState) bool {
		_, gone := st.gone.get("a")
		_, last := st.lastServed.get("m1")
		return !gone && !last && st.current("a").c == a2
	})
	now = now.Add(ForgetAfter)
	if got := reg.forget(); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("forget() = %v, want [b]", got)
	}
	step("b forgotten", func(st *regState) bool {
		return st.gone.len() == 0 && !st.known("m2") && !st.known("m3") && st.known("m1")
	})
}

// TestCowMapWritesLeaveEarlierMapsAsTheyWere: a cowMap after any sequence
// of with and without holds what a plain map given the same writes holds,
// and every earlier cowMap still holds what it held.
func TestCowMapWritesLeaveEarlierMapsAsTheyWere(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var maps []cowMap[string, int]
	var models []map[string]int
	var m cowMap[string, int]
	model := map[string]int{}
	check := func(m cowMap[string, int], want map[string]int) {
		t.Helper()
		if m.len() != len(want) {
			t.Fatalf("len %d, want %d", m.len(), len(want))
		}
		got := map[string]int{}
		for k, v := range m.all() {
			got[k] = v
		}
		for k, v := range want {
			if g, ok := m.get(k); !ok || g != v || got[k] != v {
				t.Fatalf("%q: get %d, %v, all %d; want %d", k, g, ok, got[k], v)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("all yields %d entries, want %d", len(got), len(want))
		}
	}
	for i := range 3000 {
		k := fmt.Sprint(rng.IntN(500))
		if rng.IntN(3) == 0 {
			m = m.without(k)
			delete(model, k)
		} else {
			m = m.with(k, i)
			model[k] = i
		}
		check(m, model)
		if i%100 == 0 {
			snap := make(map[string]int, len(model))
			for k, v := range model {
				snap[k] = v
			}
			maps, models = append(maps, m), append(models, snap)
		}
	}
	for i := range maps {
		check(maps[i], models[i])
	}
	if _, ok := (cowMap[string, int]{}).get("x"); ok || (cowMap[string, int]{}).without("x").len() != 0 {
		t.Fatal("the zero cowMap is not empty")
	}
}

// TestRegression_NotifyTakesNoRegistryLock: a connection wakes the
// registry's waiters (notify) after its Welcome, while a registry writer may
// hold registry.mu; notify returns and wakes them without the lock. It
// took the lock, so in TestAdmissionDoesNotWaitForARegistryWriter, whose
// writer locked the registry just after the node's Welcome, the
// connection's goroutine waited at notify and never sent the dispatch
// ("node n1: no control message", once under make test's load).
func TestRegression_NotifyTakesNoRegistryLock(t *testing.T) {
	e := startEdge(t, testConfig())
	changed := e.svc.reg.changes()
	e.svc.reg.mu.Lock()
	defer e.svc.reg.mu.Unlock()
	within(t, "notify with registry.mu held by a writer", e.svc.reg.notify)
	select {
	case <-changed:
	default:
		t.Fatal("notify did not wake the waiters on changes")
	}
}
