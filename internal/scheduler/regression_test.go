package scheduler

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// errCatalog is a resolver fault that is none of the scheduler's sentinels.
var errCatalog = errors.New("catalog unavailable")

// await is wait bounded by a failsafe a passing test never reaches: a
// waiter that should have been settled fails the test instead of hanging it.
func (p *pending) await(t *testing.T) (*Lease, error) {
	t.Helper()
	select {
	case <-p.done:
		return p.lease, p.err
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not settled")
		return nil, nil
	}
}

// TestRegression_StaleCandidateAtHeapTopBlocksLaterWaiters: a waiter whose
// resolver failed when its node reconnected kept its candidate of the old
// generation in the provider's heap, at the top; the release of the old
// generation's lease then pumped that heap, could not grant its top and
// stopped, so the later waiter, with a live candidate on the same provider,
// waited beside a free slot (until its queue timeout).
func TestRegression_StaleCandidateAtHeapTopBlocksLaterWaiters(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("a", cand("n1", 1, "p"))
	held := f.admitNow(f.req("a"))
	early := f.admitAsync(context.Background(), f.req("a"))
	f.world.fail("a", errCatalog)
	// The node reconnects; its old connection's lease holds the slot until
	// it is released.
	f.world.set("b", cand("n1", 2, "p"))
	f.activate("n1", 2, ResourceSpec{ProviderID: "p", Capacity: 1})
	late := f.admitAsync(context.Background(), f.req("b"))
	if pr := f.provider("n1", "p"); pr.Queued != 1 {
		t.Fatalf("provider lists %d waiters, want 1 (the one with a live candidate): %+v", pr.Queued, pr)
	}
	held.Release("done")
	l, err := late.await(t)
	if err != nil || l.Candidate().Generation != 2 {
		t.Fatalf("later waiter: %v %+v, want the free slot of generation 2", err, l)
	}
	if early.settled() {
		t.Fatal("the waiter whose resolver still fails was settled")
	}
	// Once its resolver recovers, the next release serves it.
	f.world.fail("a", nil)
	f.world.set("a", cand("n1", 2, "p"))
	l.Release("done")
	l2, err := early.await(t)
	if err != nil || l2.Candidate().Generation != 2 {
		t.Fatalf("earlier waiter after its resolver recovered: %v %+v", err, l2)
	}
	l2.Release("done")
}

// TestRegression_FreshAdmissionOvertakesRecoveredWaiter: a waiter whose
// resolver failed at the re-resolution after a reconnect was left without a
// live candidate; when the resolver recovered, nothing re-resolved it, and a
// request arriving later took the free slot it could use.
func TestRegression_FreshAdmissionOvertakesRecoveredWaiter(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	held := f.admitNow(f.req("m"))
	early := f.admitAsync(context.Background(), f.req("m"))
	f.world.fail("m", errCatalog)
	f.activate("n1", 2, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.s.Fence("n1", 1) // releases held: the slot is free, the resolver still fails
	if ok, _ := held.Released(); !ok || early.settled() {
		t.Fatalf("after the fence: lease released %v, waiter settled %v", ok, early.settled())
	}
	f.world.fail("m", nil)
	f.world.set("m", cand("n1", 2, "p"))
	_, fresh, err := f.s.enqueue(f.req("m"))
	if err != nil || fresh == nil {
		t.Fatalf("the later request: %v %v, want it queued behind the earlier one", fresh, err)
	}
	l, err := early.await(t)
	if err != nil || l.Candidate().Generation != 2 {
		t.Fatalf("earlier waiter: %v %+v", err, l)
	}
	l.Release("done")
	if r := <-fresh.ch; r.err != nil {
		t.Fatalf("later waiter: %v", r.err)
	} else {
		r.lease.Release("done")
	}
}

// TestRegression_RecoveredWaiterServedAtNextRelease: a waiter left without
// a live candidate by a resolver fault is re-resolved at the next release,
// even of another provider, and takes a slot that is free.
func TestRegression_RecoveredWaiterServedAtNextRelease(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.activate("n2", 1, ResourceSpec{ProviderID: "q", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	f.world.set("other", cand("n2", 1, "q"))
	held := f.admitNow(f.req("m"))
	other := f.admitNow(f.req("other"))
	w := f.admitAsync(context.Background(), f.req("m"))
	f.world.fail("m", errCatalog)
	f.world.set("m", cand("n1", 2, "p"))
	f.activate("n1", 2, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.s.Fence("n1", 1)
	f.world.fail("m", nil)
	if w.settled() {
		t.Fatal("settled before anything re-resolved it")
	}
	other.Release("done")
	l, err := w.await(t)
	if err != nil || l.Candidate() != cand("n1", 2, "p") {
		t.Fatalf("after a release elsewhere: %v %+v", err, l)
	}
	if ok, _ := held.Released(); !ok {
		t.Fatal("fence left the old lease")
	}
	l.Release("done")
}

// TestRegression_LostProviderFailsWaiterAsUnavailable: a waiter whose only
// provider meeting its needs went away (here dropped from the node's
// reconnect Hello) failed with its resolver's ErrCandidatesRejected, the
// error (HTTP 400) for a request no provider can ever take; it must fail
// with ErrProviderUnavailable (503).
func TestRegression_LostProviderFailsWaiterAsUnavailable(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "tools", Capacity: 1}, ResourceSpec{ProviderID: "plain", Capacity: 1})
	f.world.set("m", cand("n1", 1, "tools"))
	held := f.admitNow(f.req("m"))
	w := f.admitAsync(context.Background(), f.req("m"))
	f.world.fail("m", fmt.Errorf("%w: no provider for model %q has capability %q", ErrCandidatesRejected, "m", "tools"))
	f.activate("n1", 2, ResourceSpec{ProviderID: "plain", Capacity: 1})
	_, err := w.await(t)
	if !errors.Is(err, ErrProviderUnavailable) || errors.Is(err, ErrCandidatesRejected) {
		t.Fatalf("err %v, want ErrProviderUnavailable and no rejection", err)
	}
	held.Release("done")
}

// TestRegression_DrainedOrphanIsForgotten: orphan resources stayed in the
// scheduler (and its snapshots) forever, so nodes that came and went grew
// its maps without bound. A resource dropped from a reconnect Hello stays
// while a lease holds it and is forgotten at that lease's release; a fenced
// node's resources go at the fence, and the node with them.
func TestRegression_DrainedOrphanIsForgotten(t *testing.T) {
	f := newFixture(t, Config{})
	f.activate("n1", 1, ResourceSpec{ProviderID: "gone", Capacity: 1}, ResourceSpec{ProviderID: "kept", Capacity: 1})
	f.world.set("m", cand("n1", 1, "gone"))
	l := f.admitNow(f.req("m"))
	f.activate("n1", 2, ResourceSpec{ProviderID: "kept", Capacity: 1})
	if pr := f.provider("n1", "gone"); pr.Status != StatusOrphan || pr.InFlight != 1 {
		t.Fatalf("orphan with a lease: %+v", pr)
	}
	l.Release("done")
	snap := f.s.Snapshot()
	if len(snap.Providers) != 1 || snap.Providers[0].ProviderID != "kept" {
		t.Fatalf("after the orphan's last release: %+v", snap.Providers)
	}
	if err := f.s.SetCapacity("n1", "gone", 2, 0); !errors.Is(err, ErrUnknownResource) {
		t.Fatalf("capacity of a forgotten provider: %v", err)
	}
	f.s.Fence("n1", 2)
	f.s.mu.Lock()
	resources, nodes := len(f.s.resources), len(f.s.nodes)
	f.s.mu.Unlock()
	if resources != 0 || nodes != 0 {
		t.Fatalf("after the fence: %d resources, %d nodes, want none", resources, nodes)
	}
}
