package edge

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/edge/lifecycle"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

func drainMsg(reason string) *nodev1.NodeMessage {
	return &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Drain{Drain: &nodev1.Drain{Reason: reason}}}
}

// TestNodeDrain: a node that says Drain is shown draining (node and
// providers) and its providers are no candidates, even preferred ones with
// free slots: new requests go to another node. A dispatch it refuses in the
// race (sent before its Drain arrived) is admitted again on the other node,
// and does not count against its provider's circuit (one failure would
// open it here). Its run in flight goes on to its end as usual. When the
// node then closes its connection, the fence says it drained.
func TestNodeDrain(t *testing.T) {
	cfg := testConfig()
	cfg.CircuitBreaker.Failures = 1
	rec := &recorder{}
	e := startObservedEdge(t, cfg, rec)
	a := e.connect(t, hello("a-drain", prov("a", normalized, 2, "m1")))
	z := e.connect(t, hello("z-other", prov("z", normalized, 2, "m1")))
	preferA := func() contract.Request {
		req := chatReq("m1")
		req.PreferNodeID, req.PreferProviderID = "a-drain", "a"
		return req
	}

	inFlight, rs, _ := e.startRun(t, a, preferA())
	racing := e.dispatchAsync(context.Background(), preferA())
	d := a.nextDispatch(t)
	a.send(t, drainMsg("SIGTERM"))
	a.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "node is draining"}}})
	if run, _, _ := z.acceptRun(t, racing); run.Info().NodeID != "z-other" {
		t.Fatalf("the refused request ran on %s", run.Info().NodeID)
	}

	snap := e.waitUntil(t, "a draining", func(s contract.Snapshot) bool {
		p, _ := providerOf(s, "a-drain", "a")
		return p.Status == StatusDraining
	})
	for _, n := range snap.Nodes {
		if n.Draining != (n.NodeID == "a-drain") {
			t.Errorf("node %s draining %v", n.NodeID, n.Draining)
		}
	}
	if p, _ := providerOf(snap, "a-drain", "a"); p.Circuit != CircuitClosed || p.InFlight != 1 {
		t.Errorf("draining provider %+v: want its circuit closed and its run in flight", p)
	}
	if p, _ := providerOf(snap, "z-other", "z"); p.Status != scheduler.StatusAvailable {
		t.Errorf("other provider %+v", p)
	}
	if info, _ := e.svc.ModelInfo("m1"); len(info.Providers) != 1 || info.Providers[0].NodeID != "z-other" {
		t.Errorf("model info lists %+v, want only the provider in rotation", info.Providers)
	}
	// A new request, preferring a (which has a free slot), goes to z.
	if run, _, _ := e.startRun(t, z, preferA()); run.Info().NodeID != "z-other" {
		t.Fatalf("new request ran on %s", run.Info().NodeID)
	}

	// The run in flight on the draining node ends as usual.
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_STARTED, ""), event(nodev1.RunEvent_TYPE_DELTA, "hello")))
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}))
	got, err := recvAll(inFlight)
	if !errors.Is(err, io.EOF) || len(got) != 2 {
		t.Fatalf("run on the draining node: %v, %v; want its messages and a clean end", got, err)
	}
	if err := rs.CloseSend(); err != nil {
		t.Fatal(err)
	}

	if err := a.stream.CloseSend(); err != nil { // the drained node leaves
		t.Fatal(err)
	}
	a.waitClosed(t)
	e.waitUntil(t, "a gone", func(s contract.Snapshot) bool { return len(s.Nodes) == 1 })
	var types []lifecycle.Type
	fenceReason := ""
	for _, ev := range rec.all() {
		if ev.NodeID == "a-drain" {
			types = append(types, ev.Type)
			if ev.Type == lifecycle.NodeFenced {
				fenceReason = ev.Reason
			}
		}
	}
	if !slices.Contains(types, lifecycle.NodeDraining) || fenceReason != "node drained" {
		t.Errorf("events of the node %v, fence reason %q; want node_draining and a fence for \"node drained\"", types, fenceReason)
	}
}

// TestNodeDrainLeavesNowhereElse: a request queued for the only provider
// of its model fails at once with ErrProviderUnavailable (503) when that
// provider's node drains, instead of waiting for its queue timeout on a
// provider that takes no more work; a new one fails with ErrNoProvider
// (503 too). The request in flight is untouched.
func TestNodeDrainLeavesNowhereElse(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "solo")))
	run, rs, _ := e.startRun(t, n, chatReq("solo"))
	queued := e.dispatchAsync(context.Background(), chatReq("solo"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })

	n.send(t, drainMsg("SIGTERM"))
	if r := wait(t, queued); !errors.Is(r.err, scheduler.ErrProviderUnavailable) {
		t.Fatalf("queued request: %v, want ErrProviderUnavailable", r.err)
	}
	if _, err := e.svc.Dispatch(context.Background(), chatReq("solo")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("new request: %v, want ErrNoProvider", err)
	}
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE}))
	if got, err := recvAll(run); !errors.Is(err, io.EOF) || len(got) != 1 {
		t.Fatalf("run in flight: %v, %v", got, err)
	}
}
