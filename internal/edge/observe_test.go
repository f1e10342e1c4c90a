package edge

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"iop/internal/edge/contract"
	"iop/internal/edge/lifecycle"
	"iop/internal/wire/nodev1"
)

// recorder is an lifecycle.Observer that keeps every event.
type recorder struct {
	mu  sync.Mutex
	evs []lifecycle.Event
}

func (r *recorder) Observe(e lifecycle.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, e)
	r.mu.Unlock()
}

func (r *recorder) all() []lifecycle.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]lifecycle.Event(nil), r.evs...)
}

// startObservedEdge is startEdge with an observer in its Deps.
func startObservedEdge(t *testing.T, cfg Config, obs lifecycle.Observer) *testEdge {
	t.Helper()
	clk := newTestClock()
	srv, err := NewServer(cfg, Deps{Clock: clk, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() error {
		var err error
		once.Do(func() { cancel(); err = <-served })
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
		cc.Close()
	})
	return &testEdge{srv: srv, svc: srv.Service(), clk: clk, client: nodev1.NewNodeGatewayClient(cc), stop: stop}
}

// The observer sees a node connect, a run go from queued through admitted
// and started to ended with the provider's counters, and the node's fence.
func TestObserverSeesNodeAndRunLifecycle(t *testing.T) {
	rec := &recorder{}
	e := startObservedEdge(t, testConfig(), rec)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m-small")))
	first, rs, _ := e.startRun(t, n, chatReq("chat"))

	// A second request waits for the only slot. (Its run_queued is
	// published just after it queued, with the counters of that moment:
	// wait for it before freeing the slot, or it may say 0 queued.)
	res := e.dispatchAsync(context.Background(), chatReq("chat"))
	waitFor(t, func() bool {
		for _, ev := range rec.all() {
			if ev.Type == lifecycle.RunQueued {
				return true
			}
		}
		return false
	})
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE}))
	if _, err := first.Recv(); err != nil {
		t.Fatal(err)
	}
	// Its caller closes it with the request's outcome once the answer is
	// written: that publishes run_ended.
	first.Close("completed")
	d := n.nextDispatch(t)
	rs2 := n.openRun(t, d.GetRunId(), n.gen)
	e.readBody(t, d, rs2)
	second := wait(t, res)
	if second.err != nil {
		t.Fatal(second.err)
	}
	second.run.Close("client gone")
	n.cancel()
	e.waitUntil(t, "node gone", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	waitFor(t, func() bool { return len(rec.all()) == 9 })

	// The first run's end and the second's admission race (the release
	// hands the slot over): compare them by run.
	byRun := map[string][]lifecycle.Event{}
	var types []lifecycle.Type
	for _, ev := range rec.all() {
		types = append(types, ev.Type)
		byRun[ev.RunID] = append(byRun[ev.RunID], ev)
	}
	if types[0] != lifecycle.NodeConnected || types[8] != lifecycle.NodeFenced {
		t.Fatalf("events %v: want node_connected first and node_fenced last", types)
	}
	evs := rec.all()
	if c := evs[0]; c.NodeID != "n1" || c.Generation != n.gen || fmt.Sprint(c.Providers) != "[p1]" || c.Time.IsZero() {
		t.Errorf("node_connected %+v", c)
	}
	if f := evs[8]; f.NodeID != "n1" || f.Generation != n.gen || f.Reason != "connection ended" {
		t.Errorf("node_fenced %+v", f)
	}
	queued := byRun[""]
	if len(queued) != 3 || queued[1].Type != lifecycle.RunQueued || queued[1].Model != "chat" || queued[1].Load.ModelQueued != 1 {
		t.Errorf("events without a run id %+v, want node_connected, run_queued (1 queued), node_fenced", queued)
	}
	one, two := byRun[first.Info().RunID], byRun[second.run.Info().RunID]
	if fmt.Sprint(typesOf(one)) != "[run_admitted run_started run_ended]" || fmt.Sprint(typesOf(two)) != "[run_admitted run_started run_ended]" {
		t.Fatalf("first run %v, second %v", typesOf(one), typesOf(two))
	}
	if a := one[0]; a.Model != "chat" || a.ProviderID != "p1" || a.ServedModel != "m-small" ||
		a.QueueReason != "immediate" || a.Load == nil || a.Load.InFlight != 1 || a.Load.Capacity != 1 {
		t.Errorf("first run_admitted %+v load %+v", a, a.Load)
	}
	if end := one[2]; end.Reason != string(EndComplete) || end.Outcome != "completed" || end.Load == nil {
		t.Errorf("first run_ended %+v", end)
	}
	if a := two[0]; a.QueueReason != "queued" || a.Load.InFlight != 1 || a.Load.ModelQueued != 0 {
		t.Errorf("second run_admitted %+v load %+v", a, a.Load)
	}
	if end := two[2]; end.Reason != string(EndClosed) || end.Outcome != "client gone" || end.Load.InFlight != 0 {
		t.Errorf("second run_ended %+v load %+v", end, end.Load)
	}
}

func typesOf(evs []lifecycle.Event) []lifecycle.Type {
	var out []lifecycle.Type
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// A dispatch retried after its generation was replaced is reported once.
func TestObserverSeesDispatchRetry(t *testing.T) {
	rec := &recorder{}
	e := startObservedEdge(t, testConfig(), rec)
	h := hello("n1", prov("p1", normalized, 1, "m1"))
	old := e.connect(t, h)
	admitted, proceed := reconnectOnAdmit(e, 1)
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	wait(t, admitted)
	fresh := e.connect(t, h)
	proceed <- struct{}{}
	d := fresh.nextDispatch(t)
	e.readBody(t, d, fresh.openRun(t, d.GetRunId(), fresh.gen))
	r := wait(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.run.Close("test")
	var retries []lifecycle.Event
	for _, ev := range rec.all() {
		if ev.Type == lifecycle.DispatchRetried {
			retries = append(retries, ev)
		}
	}
	if len(retries) != 1 || retries[0].NodeID != "n1" || retries[0].Generation != old.gen || retries[0].Reason != ErrStaleGeneration.Error() {
		t.Fatalf("retries %+v", retries)
	}
}

// TestRunEndedByFenceReportsLoad: a run whose node goes away ends after
// the fence forgot its provider (drained orphan); its run_ended event still
// carries the counters: nothing in flight on the provider, and the model's
// queue length. Before, it had none once its provider was forgotten.
func TestRunEndedByFenceReportsLoad(t *testing.T) {
	rec := &recorder{}
	e := startObservedEdge(t, testConfig(), rec)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	run, _, _ := e.startRun(t, n, chatReq("m1"))
	n.cancel()
	if _, err := recvAll(run); err == nil {
		t.Fatal("run did not end")
	}
	run.Close("node_gone") // its end is published when its caller closes it
	e.waitUntil(t, "provider forgotten", func(s contract.Snapshot) bool { _, ok := providerOf(s, "n1", "p1"); return !ok })
	var ended *lifecycle.Event
	waitFor(t, func() bool {
		for _, ev := range rec.all() {
			if ev.Type == lifecycle.RunEnded && ev.RunID == run.Info().RunID {
				ended = &ev
				return true
			}
		}
		return false
	})
	if ended.Load == nil || ended.Load.InFlight != 0 || ended.Load.ModelQueued != 0 {
		t.Fatalf("run_ended %+v load %+v, want a load with nothing in flight", ended, ended.Load)
	}
}

// endsOf returns the run_ended events rec has for run id.
func endsOf(rec *recorder, id string) []lifecycle.Event {
	var out []lifecycle.Event
	for _, ev := range rec.all() {
		if ev.Type == lifecycle.RunEnded && ev.RunID == id {
			out = append(out, ev)
		}
	}
	return out
}

// TestRunEndedCarriesTheCallersOutcome: a run's end is published once,
// when its caller closes it with the outcome of the request it served:
// not when Cancel or a terminal message ends it and
// frees its slot, and never twice.
func TestRunEndedCarriesTheCallersOutcome(t *testing.T) {
	rec := &recorder{}
	e := startObservedEdge(t, testConfig(), rec)
	n := e.connect(t, hello("n1", prov("p1", normalized, 2, "m")))

	// Cancelled (the client left): the slot is free at once, the end is
	// published by Close.
	run, _, _ := e.startRun(t, n, chatReq("m"))
	run.Cancel("client gone")
	if c := n.nextCancel(t); c.GetRunId() != run.Info().RunID {
		t.Fatalf("cancel %+v, want run %s's", c, run.Info().RunID)
	}
	e.waitUntil(t, "slot freed", func(s contract.Snapshot) bool { return s.Leases == 0 })
	if evs := endsOf(rec, run.Info().RunID); len(evs) != 0 {
		t.Fatalf("run_ended before Close: %+v", evs)
	}
	run.Close("client_gone")
	run.Close("completed")
	if evs := endsOf(rec, run.Info().RunID); len(evs) != 1 || evs[0].Outcome != "client_gone" ||
		evs[0].Reason != string(EndClosed) || evs[0].Load == nil || evs[0].Load.InFlight != 0 {
		t.Fatalf("run_ended %+v, want one with outcome client_gone", evs)
	}

	// Ended by its terminal message: the same.
	run, rs, _ := e.startRun(t, n, chatReq("m"))
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_COMPLETE, "")))
	if _, err := run.Recv(); err != nil {
		t.Fatal(err)
	}
	if e.svc.Snapshot().Leases != 0 || len(endsOf(rec, run.Info().RunID)) != 0 {
		t.Fatalf("after the terminal message: %d leases, run_ended %+v; want the slot free and no event yet",
			e.svc.Snapshot().Leases, endsOf(rec, run.Info().RunID))
	}
	run.Close("completed")
	if evs := endsOf(rec, run.Info().RunID); len(evs) != 1 || evs[0].Outcome != "completed" || evs[0].Reason != string(EndComplete) {
		t.Fatalf("run_ended %+v, want one with outcome completed", evs)
	}
}

// TestDroppedAttemptsPublishTheirEndWithoutOutcome: an attempt Dispatch
// drops to admit the request again is published once, without an outcome
// (it is not a request's end); the run handed to the caller waits for
// its Close.
func TestDroppedAttemptsPublishTheirEndWithoutOutcome(t *testing.T) {
	rec := &recorder{}
	e := startObservedEdge(t, retryConfig(1), rec)
	bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
	good := e.connect(t, hello("z-good", prov("z", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	d, rs := acceptRun(t, bad)
	sendUp(t, rs, errorEvent(503))
	_, rs2 := acceptRun(t, good)
	sendUp(t, rs2, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	r := wait(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	if evs := endsOf(rec, d.GetRunId()); len(evs) != 1 || evs[0].Outcome != "" {
		t.Fatalf("the dropped attempt's run_ended %+v, want one without an outcome", evs)
	}
	if evs := endsOf(rec, r.run.Info().RunID); len(evs) != 0 {
		t.Fatalf("the caller's run published its end before Close: %+v", evs)
	}
	r.run.Close("completed")
	if evs := endsOf(rec, r.run.Info().RunID); len(evs) != 1 || evs[0].Outcome != "completed" {
		t.Fatalf("run_ended %+v", evs)
	}
}
