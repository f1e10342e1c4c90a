package edge

import (
	"context"
	"errors"
	"testing"
	"time"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// graceConfig is retryConfig(retries) with a reconnect grace the test
// clock never reaches.
func graceConfig(retries int) Config {
	cfg := retryConfig(retries)
	cfg.Queue.ReconnectGrace = time.Hour
	cfg.Queue.QueueTimeout = 2 * time.Hour
	return cfg
}

// TestRegression_NodeLostBeforeFirstByteWaitsForIt: the only node of a
// model is killed while a run it just opened has sent nothing. Its run
// stream breaks before the edge sees its control stream end, so when the
// request is admitted again that node's connection is still registered.
// The request used to fail at once (503: no provider but the one that
// failed); it must wait for the node within reconnect_grace and be
// served by its next connection.
func TestRegression_NodeLostBeforeFirstByteWaitsForIt(t *testing.T) {
	e := startEdge(t, graceConfig(1))
	h := hello("n1", prov("p1", normalized, 1, "m1"))
	old := e.connect(t, h)
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	_, rs := acceptRun(t, old)
	if err := rs.CloseSend(); err != nil { // the run stream ends first
		t.Fatal(err)
	}
	waitHeld(t, e, res)
	old.cancel() // then the control stream: the edge fences generation 1
	e.waitUntil(t, "n1 fenced", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })

	fresh := e.connect(t, h)
	_, rs2 := acceptRun(t, fresh)
	sendUp(t, rs2, events(event(nodev1.RunEvent_TYPE_DELTA, "hi")))
	r := wait(t, res)
	if r.err != nil {
		t.Fatalf("Dispatch = %v, want a run on the node's next connection", r.err)
	}
	defer r.run.Close("test")
	if info := r.run.Info(); info.Generation != fresh.gen || info.QueueReason != "queued" {
		t.Fatalf("run on generation %d (%s), want %d (queued)", info.Generation, info.QueueReason, fresh.gen)
	}
}

// TestNodeLostBeforeFirstByteFailsAfterGrace: held the same way, a
// request whose node does not come back within reconnect_grace gets 503
// (ErrProviderUnavailable), saying why, when the grace ends.
func TestNodeLostBeforeFirstByteFailsAfterGrace(t *testing.T) {
	cfg := graceConfig(1)
	cfg.Queue.ReconnectGrace = 5 * time.Second
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	_, rs := acceptRun(t, n)
	if err := rs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, e, res)
	n.cancel()
	e.waitUntil(t, "n1 fenced", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	e.clk.Advance(5 * time.Second)
	r := wait(t, res)
	if !errors.Is(r.err, scheduler.ErrProviderUnavailable) {
		t.Fatalf("Dispatch = %v, want ErrProviderUnavailable", r.err)
	}
}

// waitHeld waits until the one request res waits for is queued holding no
// slot; it fails if Dispatch returns first.
func waitHeld(t *testing.T, e *testEdge, res <-chan dispatched) {
	t.Helper()
	waitFor(t, func() bool {
		select {
		case r := <-res:
			t.Fatalf("Dispatch = %v, want it held for the node", r.err)
		default:
		}
		s := e.svc.Snapshot()
		return s.Waiters == 1 && s.Leases == 0
	})
}

// TestRegression_DrainRefusalBeforeTheDrainWaitsForTheNode: the only node
// of a model starts draining and refuses a dispatch sent just before its
// Drain reached the edge (a rolling restart under load). The refusal came
// first, so it was taken for an ordinary refusal: the request was
// admitted again without that connection, found no provider and failed
// 502 — a queued client of a rolling restart lost its request. The
// refusal now says the node drains, and the request waits for the node's
// next connection within reconnect_grace.
func TestRegression_DrainRefusalBeforeTheDrainWaitsForTheNode(t *testing.T) {
	e := startEdge(t, graceConfig(1))
	h := hello("n1", prov("p1", normalized, 1, "m1"))
	old := e.connect(t, h)
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	d := old.nextDispatch(t)
	old.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{
		RunId: d.GetRunId(), Reason: "node is draining", Draining: true}}})
	waitHeld(t, e, res)
	old.send(t, drainMsg("SIGTERM"))
	old.cancel()
	e.waitUntil(t, "n1 fenced", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })

	fresh := e.connect(t, h)
	_, rs := acceptRun(t, fresh)
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "hi")))
	r := wait(t, res)
	if r.err != nil {
		t.Fatalf("Dispatch = %v, want a run on the node's next connection", r.err)
	}
	defer r.run.Close("test")
	if info := r.run.Info(); info.Generation != fresh.gen {
		t.Fatalf("run on generation %d, want %d", info.Generation, fresh.gen)
	}
}
