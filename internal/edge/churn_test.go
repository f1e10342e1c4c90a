package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// edgeSizes is the size of every map of the edge core that could grow
// with the nodes it has seen.
type edgeSizes struct {
	nodes, served, lastServed, gone, expiry int // registry
	circuits, circuitNodes                  int // breakers
	providers, groups, waiters, leases      int // scheduler (snapshot)
	runs                                    int // Service.runs
}

func (s *Service) sizes() edgeSizes {
	var z edgeSizes
	st := s.reg.load()
	z.nodes, z.served, z.lastServed, z.gone = st.nodes.len(), st.served.len(), st.lastServed.len(), st.gone.len()
	s.reg.mu.Lock()
	z.expiry = len(s.reg.expiry)
	s.reg.mu.Unlock()
	s.breakers.mu.Lock()
	z.circuits, z.circuitNodes = len(s.breakers.circuits), len(s.breakers.byNode)
	s.breakers.mu.Unlock()
	snap := s.sched.Snapshot()
	z.providers, z.groups, z.waiters, z.leases = len(snap.Providers), len(snap.Groups), snap.Waiters, snap.Leases
	s.mu.Lock()
	z.runs = len(s.runs)
	s.mu.Unlock()
	return z
}

// baseline is the edge's state with the node "stays" connected after a
// forgetTrigger: its connection and provider, its model name served, and
// the two expiry marks its trigger disconnect left (its gone node and its
// model name, both back since; dropped at the next trigger).
var baseline = edgeSizes{nodes: 1, served: 1, expiry: 2, providers: 1}

// forgetTrigger lets ForgetAfter pass, disconnects stays (the node "stays")
// and connects it again, and returns its new connection: the disconnect
// forgets every node gone ForgetAfter before it.
func (e *testEdge) forgetTrigger(t *testing.T, stays *fakeNode) *fakeNode {
	t.Helper()
	e.clk.Advance(ForgetAfter)
	stays.cancel()
	e.waitUntil(t, "stays gone", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	return e.connect(t, hello("stays", prov("p", normalized, 1, "m-stays")))
}

// waitServeStarted waits until Serve has started the last of its
// goroutines (keepLoaded), failing after the failsafe: a node on the
// in-memory link is served before Serve runs, and a goroutine count taken
// earlier misses Serve's own.
func waitServeStarted(t *testing.T) {
	t.Helper()
	deadline := time.After(failsafe)
	buf := make([]byte, 1<<20)
	for !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("edge.(*Service).keepLoaded(")) {
		select {
		case <-time.After(time.Millisecond):
		case <-deadline:
			t.Fatal("Serve did not start its residency goroutine (keepLoaded)")
		}
	}
}

// waitSizes waits until the sizes are want (the disconnect that forgets
// gone nodes finishes on its connection's goroutine), failing after the
// failsafe.
func (s *Service) waitSizes(t *testing.T, want edgeSizes) edgeSizes {
	t.Helper()
	deadline := time.After(failsafe)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		got := s.sizes()
		if got == want {
			return got
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("sizes %+v, want %+v", got, want)
		}
	}
}

// TestChurnOfNodesLeavesEdgeStateAtItsStartingSize connects and
// disconnects 10,000 nodes with distinct ids, each serving a model name of
// its own and with a circuit breaker entry (a failed attempt), through the
// Service's own connect and disconnect paths (accept, registry, Activate,
// closeConn; the gRPC streams left out: TestChurnOfRealNodeConnections has
// them). Once ForgetAfter has passed, the next connect forgets them all:
// the registry, the breakers and the scheduler are back at their starting
// size. Before that, a gone node is still remembered.
func TestChurnOfNodesLeavesEdgeStateAtItsStartingSize(t *testing.T) {
	const nodes = 10_000
	e := startEdge(t, testConfig())
	stays := e.connect(t, hello("stays", prov("p", normalized, 1, "m-stays")))
	// The trigger that forgets: ForgetAfter passes, then a disconnect and a
	// connect. Once before measuring, so the baseline holds what it leaves
	// (the expiry marks of its own disconnect, forgotten at the next one).
	stays = e.forgetTrigger(t, stays)
	before := e.svc.waitSizes(t, baseline)
	t.Logf("before: %+v", before)

	for i := range nodes {
		node := fmt.Sprintf("node-%05d", i)
		c, err := e.svc.accept(hello(node, prov("p", normalized, 1, "m-"+node), prov("q", tunnel, 2, "shared")))
		if err != nil {
			t.Fatal(err)
		}
		e.svc.reg.add(c)
		e.svc.forgetGone()
		if err := e.svc.sched.Activate(c.nodeID, c.gen, e.svc.reg.specs(c), func() bool { return e.svc.reg.isCurrent(c) }); err != nil {
			t.Fatal(err)
		}
		tk, ok := e.svc.breakers.acquire(providerKey{node, "p"})
		if !ok {
			t.Fatalf("node %d: out of rotation", i)
		}
		tk.done(outcomeFailed)
		e.clk.Advance(time.Millisecond)
		e.svc.closeConn(c, errors.New("churn"))
	}
	mid := e.svc.sizes()
	t.Logf("after %d nodes, within ForgetAfter: %+v", nodes, mid)
	if mid.gone != nodes || mid.circuits != nodes || mid.lastServed != nodes+1 || mid.providers != before.providers {
		t.Fatalf("within ForgetAfter: %+v; want %d gone nodes, their circuits and model names remembered, no resource left", mid, nodes)
	}
	// A model only a gone node served is still known: no provider (503),
	// not unknown (404).
	if _, err := e.svc.Dispatch(context.Background(), chatReq("m-node-00000")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("a model served ForgetAfter ago or less: %v, want ErrNoProvider", err)
	}

	e.forgetTrigger(t, stays)
	after := e.svc.waitSizes(t, before)
	t.Logf("after ForgetAfter: %+v", after)
	if _, err := e.svc.Dispatch(context.Background(), chatReq("m-node-00000")); !errors.Is(err, scheduler.ErrUnknownModel) {
		t.Fatalf("a model no node served for ForgetAfter: %v, want ErrUnknownModel", err)
	}
}

// TestChurnOfRealNodeConnections: nodes that connect over gRPC, take a
// request each (refused, so their circuit breaker records a failure) and
// disconnect leave, once ForgetAfter passed, the edge's maps, breakers and
// scheduler at their starting size and its goroutines at their baseline.
func TestChurnOfRealNodeConnections(t *testing.T) {
	const nodes = 1000
	e := startEdge(t, testConfig())
	// One node connects and goes first, so the baseline has every lazily
	// started gRPC goroutine; then the node that stays.
	churn := func(i int) {
		id := fmt.Sprintf("churn-%04d", i)
		model := "m-" + id
		n := e.connect(t, hello(id, prov("p", normalized, 1, model)))
		res := e.dispatchAsync(context.Background(), chatReq(model))
		d := n.nextDispatch(t)
		n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "busy"}}})
		if r := wait(t, res); !errors.Is(r.err, ErrDispatchRefused) {
			t.Fatalf("node %s: Dispatch = %v, want ErrDispatchRefused", id, r.err)
		}
		n.cancel()
		if err := n.waitClosed(t); err == nil {
			t.Fatalf("node %s: stream ended without error", id)
		}
		e.waitUntil(t, id+" gone", func(s contract.Snapshot) bool {
			_, ok := providerOf(s, id, "p")
			return !ok
		})
	}
	churn(-1)
	stays := e.forgetTrigger(t, e.connect(t, hello("stays", prov("p", normalized, 1, "m-stays"))))
	before := e.svc.waitSizes(t, baseline)
	waitServeStarted(t)
	goroutines := runtime.NumGoroutine()
	atBaseline := make([]byte, 1<<20)
	atBaseline = atBaseline[:runtime.Stack(atBaseline, true)]
	t.Logf("before: %+v, %d goroutines", before, goroutines)

	for i := range nodes {
		churn(i)
	}
	mid := e.svc.sizes()
	t.Logf("after %d nodes, within ForgetAfter: %+v", nodes, mid)
	if mid.gone != nodes || mid.circuits != nodes {
		t.Fatalf("within ForgetAfter: %+v, want %d gone nodes and circuits remembered", mid, nodes)
	}

	e.forgetTrigger(t, stays)
	after := e.svc.waitSizes(t, before)
	t.Logf("after ForgetAfter: %+v", after)
	deadline := time.After(failsafe)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for runtime.NumGoroutine() > goroutines {
		select {
		case <-tick.C:
		case <-deadline:
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, baseline %d:\n%s\nat the baseline:\n%s", runtime.NumGoroutine(), goroutines, buf[:runtime.Stack(buf, true)], atBaseline)
		}
	}
	t.Logf("after: %d goroutines", runtime.NumGoroutine())
}
