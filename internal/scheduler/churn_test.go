package scheduler

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// schedulerSizes is the size of every map and list of a Scheduler that
// could grow with the nodes it has seen.
type schedulerSizes struct {
	resources, nodes, groups, runs, waiters, stale, leases, timers int
}

func (f *fixture) sizes() schedulerSizes {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	z := schedulerSizes{
		resources: len(f.s.resources), nodes: len(f.s.nodes), groups: len(f.s.groups), runs: len(f.s.byRun),
		waiters: f.s.waiters, leases: f.s.active, timers: f.clk.Pending(),
	}
	for w := f.s.staleHead; w != nil; w = w.nextStale {
		z.stale++
	}
	return z
}

// TestChurnOfNodesLeavesStateAtItsStartingSize connects and disconnects
// 10,000 nodes with distinct ids, each with leases and waiters on it when
// it goes, in the ways a node goes: fenced with a lease and a waiter on it,
// reconnected without one of its providers and then fenced, fenced as a
// whole node after its run ended, fenced while its waiter's resolver fails.
// Afterwards the scheduler holds what it held before: the resources and the
// node of the one node that stayed, the same groups (the model names are
// the same), no run, waiter, lease or timer.
func TestChurnOfNodesLeavesStateAtItsStartingSize(t *testing.T) {
	const nodes = 10_000
	f := newFixture(t, Config{})
	f.activate("stays", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("stays", 1, "p"))
	// Group m exists from the start: a request queued in it once.
	warm := f.admitNow(f.req("m"))
	if _, w, err := f.s.enqueue(f.req("m")); err != nil || w == nil {
		t.Fatalf("warm-up waiter: %v %v", w, err)
	} else {
		_ = f.s.abandon(w, context.Canceled)
	}
	warm.Release("warm up")
	before := f.sizes()
	t.Logf("before: %+v", before)

	for i := range nodes {
		node, gen := fmt.Sprintf("node-%05d", i), uint64(i+2)
		f.activate(node, gen, ResourceSpec{ProviderID: "p", Capacity: 1}, ResourceSpec{ProviderID: "q", Capacity: 1})
		f.world.set("m", cand(node, gen, "p"))
		l := f.admitNow(f.req("m"))
		l.Track(fmt.Sprintf("run-%d", i))
		_, w, err := f.s.enqueue(f.req("m"))
		if err != nil || w == nil {
			t.Fatalf("node %d: waiter: %v %v", i, w, err)
		}
		switch i % 4 {
		case 0: // fenced with its lease and a waiter on it
			f.world.set("m")
			f.s.Fence(node, gen)
		case 1: // reconnects without p (its lease drains p; the waiter moves to q), then fenced
			f.world.set("m", cand(node, gen+1, "q"))
			f.activate(node, gen+1, ResourceSpec{ProviderID: "q", Capacity: 1})
			if r := <-w.ch; r.lease == nil || r.lease.Candidate().ProviderID != "q" {
				t.Fatalf("node %d: waiter after the reconnect: %+v", i, r)
			} else {
				r.lease.Track(fmt.Sprintf("run-%d-q", i))
			}
			f.s.ReleaseRun(fmt.Sprintf("run-%d", i), "complete")
			f.world.set("m")
			f.s.Fence(node, gen+1)
		case 2: // the run ends, the waiter takes the slot and leaves, whole-node fence
			l.Release("complete")
			if r := <-w.ch; r.lease == nil {
				t.Fatalf("node %d: waiter not handed the slot: %v", i, r.err)
			} else {
				r.lease.Release("complete")
			}
			f.world.set("m")
			f.s.Fence(node, 0)
		case 3: // fenced while the waiter's resolver fails: it stays queued, stale
			f.world.fail("m", errCatalog)
			f.s.Fence(node, gen)
			if err := f.s.abandon(w, context.Canceled); !errors.Is(err, context.Canceled) {
				t.Fatalf("node %d: abandon: %v", i, err)
			}
			f.world.fail("m", nil)
		}
		if i%4 == 0 {
			if r := <-w.ch; !errors.Is(r.err, ErrProviderUnavailable) {
				t.Fatalf("node %d (case %d): waiter: %+v, want ErrProviderUnavailable", i, i%4, r)
			}
		}
		if ok, _ := l.Released(); !ok {
			t.Fatalf("node %d: lease not released", i)
		}
	}
	f.world.set("m", cand("stays", 1, "p"))
	after := f.sizes()
	t.Logf("after %d nodes: %+v", nodes, after)
	if after != before {
		t.Fatalf("after %d nodes came and went: %+v, before %+v", nodes, after, before)
	}
	if snap := f.s.Snapshot(); len(snap.Providers) != 1 || snap.Providers[0].NodeID != "stays" {
		t.Fatalf("snapshot lists %+v", snap.Providers)
	}
}
