package scheduler

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestReconnectGraceKeepsWaiterUntilNodeReturns: with a reconnect grace, a
// waiter whose only provider's node is fenced stays queued; the node's new
// generation hands it the slot. A second waiter, lost the same way, fails
// with ErrProviderUnavailable when its grace (the injected clock) ends.
func TestReconnectGraceKeepsWaiterUntilNodeReturns(t *testing.T) {
	f := newFixture(t, Config{Default: Policy{QueueTimeout: 30 * time.Second, ReconnectGrace: 5 * time.Second}})
	f.activate("n1", 1, ResourceSpec{ProviderID: "p", Capacity: 1})
	f.world.set("m", cand("n1", 1, "p"))
	l := f.admitNow(f.req("m"))
	p := f.admitAsync(context.Background(), f.req("m"))
	f.world.set("m") // the catalog no longer lists the node
	f.s.Fence("n1", 1)
	f.clk.Advance(4 * time.Second)
	if p.settled() {
		_, err := p.wait()
		t.Fatalf("waiter settled within its grace: %v", err)
	}
	f.world.set("m", cand("n1", 2, "p"))
	f.activate("n1", 2, ResourceSpec{ProviderID: "p", Capacity: 1})
	l2, err := p.wait()
	if err != nil || l2.Candidate().Generation != 2 {
		t.Fatalf("after the node came back: %v %+v", err, l2)
	}
	if ok, _ := l.Released(); !ok {
		t.Fatal("fence did not release the lease")
	}

	q := f.admitAsync(context.Background(), f.req("m"))
	f.world.set("m")
	f.s.Fence("n1", 2)
	f.clk.Advance(4 * time.Second)
	if q.settled() {
		t.Fatal("second waiter settled within its grace")
	}
	f.clk.Advance(time.Second)
	if _, err := q.wait(); !errors.Is(err, ErrProviderUnavailable) {
		t.Fatalf("after the grace: %v, want ErrProviderUnavailable", err)
	}
	if snap := f.s.Snapshot(); snap.Waiters != 0 || snap.Leases != 0 {
		t.Fatalf("leftovers %+v", snap)
	}
}
