package edge

import (
	"context"
	"testing"

	"iop/internal/edge/contract"
)

// TestBatchBandThroughTheEdge: a request of contract.PriorityBatch reaches
// the scheduler's batch band (the edge's clamp lets -2 through), counts in
// the provider's BatchInFlight, leaves queue.batch.headroom free for an
// interactive request, and a reload of the headroom hands out the slot it
// frees to the queued batch request.
func TestBatchBandThroughTheEdge(t *testing.T) {
	cfg := testConfig()
	cfg.Queue.Batch = BatchQueueConfig{Headroom: 1}
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("p1", normalized, 2, "m-small")))
	batchReq := func() contract.Request {
		r := chatReq("m-small")
		r.Priority = contract.PriorityBatch
		return r
	}
	first, _, _ := e.startRun(t, n, batchReq())
	defer first.Close("test")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	second := e.dispatchAsync(ctx, batchReq())
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	if p := e.svc.Snapshot().Providers[0]; p.InFlight != 1 || p.BatchInFlight != 1 {
		t.Fatalf("provider: %d in flight, %d batch; want 1, 1 (headroom 1 of capacity 2)", p.InFlight, p.BatchInFlight)
	}
	interactive, _, _ := e.startRun(t, n, chatReq("m-small"))
	interactive.Close("test")
	n.nextCancel(t)
	waitFor(t, func() bool { return e.svc.Snapshot().Leases == 1 })
	if e.svc.Snapshot().Waiters != 1 {
		t.Fatal("the batch request took the headroom slot the interactive one freed")
	}
	next := testConfig()
	next.Queue.Batch = BatchQueueConfig{Headroom: -1}
	if _, err := e.svc.Reload(next); err != nil {
		t.Fatal(err)
	}
	run, _, _ := n.acceptRun(t, second)
	defer run.Close("test")
	if p := e.svc.Snapshot().Providers[0]; p.InFlight != 2 || p.BatchInFlight != 2 {
		t.Fatalf("after the reload: %d in flight, %d batch; want 2, 2", p.InFlight, p.BatchInFlight)
	}
}
