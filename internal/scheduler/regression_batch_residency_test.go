package scheduler

import (
	"context"
	"testing"
	"time"
)

// TestRegression_ResidencyBatchWaiterStuckBehindADecayedDemand: a batch
// request for y on an idle provider
// that holds only x, just asked for 20 times, is held (evictInDemand, its
// hold demand x load time, at most max_extra_wait), but a batch waiter
// got no swap timer (enqueue armed waitSwapLocked for other bands only)
// and is never overdue, so when the hold has passed nothing offers it
// the idle provider again: with no other request it waits out its queue
// timeout (24 h). The test advances the fake clock 10 minutes, by
// seconds, with no other request.
func TestRegression_ResidencyBatchWaiterStuckBehindADecayedDemand(t *testing.T) {
	checkBatchWaiterGranted(t, 20)
}

func checkBatchWaiterGranted(t *testing.T, xAsked int) {
	f := newFixture(t, residencyConfig())
	f.activate("n1", 1, ResourceSpec{ProviderID: "a", Capacity: 2})
	f.setLoaded("a", 1, "x")
	f.setModel("x", "a")
	f.setModel("y", "a")
	for range xAsked {
		l := f.admitNow(f.req("x"))
		f.clk.Advance(100 * time.Millisecond)
		l.Release("done")
	}
	p := f.admitAsync(context.Background(), f.preq("y", PriorityBatch))
	for range 600 {
		select {
		case <-p.done:
			l := leaseOf(t, p)
			if !l.Info().Load {
				t.Fatalf("y granted without a load: %+v", l.Info())
			}
			l.Release("done")
			return
		default:
		}
		f.clk.Advance(time.Second)
	}
	select {
	case <-p.done:
		leaseOf(t, p).Release("done")
	case <-time.After(5 * time.Second):
		t.Fatalf("the batch request for y still waits 10 min after x's last request on an idle provider (waiters %d)", f.waiters())
	}
}
