package edge

import (
	"context"
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iop/internal/wire/nodev1"
)

// openWarm opens a warm Run stream (RunOpen.idle) naming n and gen.
func (n *fakeNode) openWarm(t *testing.T, gen uint64) runStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rs, err := n.e.client.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{NodeId: n.id, Generation: gen, Idle: true}}}); err != nil {
		t.Fatal(err)
	}
	return rs
}

// idleStreams is the number of warm streams the edge holds idle for
// node's current connection (NodeSnapshot.IdleRunStreams), -1 when it has
// none.
func (e *testEdge) idleStreams(node string) int {
	for _, n := range e.svc.Snapshot().Nodes {
		if n.NodeID == node {
			return n.IdleRunStreams
		}
	}
	return -1
}

// waitIdleStreams waits until node's connection holds want idle streams.
func (e *testEdge) waitIdleStreams(t *testing.T, node string, want int) {
	t.Helper()
	waitFor(t, func() bool { return e.idleStreams(node) == want })
}

// warmDispatch reads the Dispatch the edge sends down the warm stream rs.
func warmDispatch(t *testing.T, rs runStream) *nodev1.Dispatch {
	t.Helper()
	type got struct {
		m   *nodev1.RunDown
		err error
	}
	ch := make(chan got, 1)
	go func() {
		m, err := rs.Recv()
		ch <- got{m, err}
	}()
	g := wait(t, ch)
	m, err := g.m, g.err
	if err != nil {
		t.Fatalf("warm stream: %v", err)
	}
	if m.GetDispatch() == nil {
		t.Fatalf("warm stream: got %v, want Dispatch", m)
	}
	return m.GetDispatch()
}

// noControlDispatch fails when a Dispatch is waiting on n's control
// stream.
func (n *fakeNode) noControlDispatch(t *testing.T) {
	t.Helper()
	for {
		select {
		case m := <-n.msgs:
			if m.GetDispatch() != nil {
				t.Fatalf("node %s: Dispatch %s on the control stream, want it on the warm stream", n.id, m.GetDispatch().GetRunId())
			}
		default:
			return
		}
	}
}

// A dispatch takes an idle warm stream of the selected connection: its
// Dispatch goes down that stream (not on the control stream), Dispatch
// returns the run at once (no RunOpen), the node's answer comes up the
// same stream, and its end releases the slot and ends the stream cleanly
// (no Cancel). A second dispatch, finding no idle stream, goes on the
// control stream as before.
func TestWarmStreamCarriesDispatch(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m-big")))
	rs := n.openWarm(t, n.gen)
	e.waitIdleStreams(t, "n1", 1)

	res := e.dispatchAsync(context.Background(), chatReq("m-big"))
	d := warmDispatch(t, rs)
	if d.GetProviderId() != "p" || d.GetServedModel() != "m-big" || !d.GetBodyInline() || string(d.GetBody()) != `{"model":"m-big"}` {
		t.Fatalf("warm Dispatch %v", d)
	}
	got := wait(t, res)
	if got.err != nil {
		t.Fatalf("Dispatch: %v", got.err)
	}
	r := got.run
	defer r.Close("test")
	if r.Info().RunID != d.GetRunId() {
		t.Fatalf("run %q, Dispatch names %q", r.Info().RunID, d.GetRunId())
	}
	n.noControlDispatch(t)
	if got := e.idleStreams("n1"); got != 0 {
		t.Fatalf("%d idle streams after the dispatch took one, want 0", got)
	}
	if got := e.inFlight("n1", "p"); got != 1 {
		t.Fatalf("in-flight %d, want 1", got)
	}

	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "hi")))
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}))
	msgs, err := recvAll(r)
	if !errors.Is(err, io.EOF) || len(msgs) != 2 || first(msgs[0]).Text != "hi" || !msgs[1].Ends {
		t.Fatalf("Recv: %v, %v; want the delta and the complete, then io.EOF", msgs, err)
	}
	if got := e.inFlight("n1", "p"); got != 0 {
		t.Fatalf("in-flight %d after the run's end, want 0", got)
	}
	if down, err := drainRun(t, rs); !errors.Is(err, io.EOF) || len(down) != 0 {
		t.Fatalf("after the run: %v, %v; want a clean end, nothing more", down, err)
	}

	// No idle stream left: the control stream.
	r2, rs2, _ := e.startRun(t, n, chatReq("m-big"))
	sendUp(t, rs2, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE}))
	if _, err := recvAll(r2); !errors.Is(err, io.EOF) {
		t.Fatalf("control-stream run: %v", err)
	}
}

// A warm stream is refused unless it names its node's current
// connection: an old generation (the node reconnected), a generation
// never handed out, or an unknown node.
func TestWarmStreamOfOldGenerationRefused(t *testing.T) {
	e := startEdge(t, testConfig())
	h := hello("n1", prov("p", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m-big"))
	old := e.connect(t, h)
	n := e.connect(t, h)
	if n.gen <= old.gen {
		t.Fatalf("generations %d then %d", old.gen, n.gen)
	}
	for _, c := range []struct {
		name string
		node string
		gen  uint64
	}{
		{"old generation", "n1", old.gen},
		{"future generation", "n1", n.gen + 1},
		{"unknown node", "n2", n.gen},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := (&fakeNode{e: e, id: c.node}).openWarm(t, c.gen)
			_, err := rs.Recv()
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("warm stream of %s generation %d: %v, want FailedPrecondition", c.node, c.gen, err)
			}
		})
	}
	if got := e.idleStreams("n1"); got != 0 {
		t.Fatalf("%d idle streams, want 0", got)
	}
	// The current generation's is taken.
	n.openWarm(t, n.gen)
	e.waitIdleStreams(t, "n1", 1)
}

// The idle streams of a connection end when it is fenced (its control
// stream ends), when its node drains, and when the edge stops; a warm
// stream opened after its node drains is refused. No goroutine is left
// (TestMain's goleak).
func TestWarmStreamsEndWithTheirConnection(t *testing.T) {
	h := hello("n1", prov("p", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m-big"))
	t.Run("fence", func(t *testing.T) {
		e := startEdge(t, testConfig())
		n := e.connect(t, h)
		a, b := n.openWarm(t, n.gen), n.openWarm(t, n.gen)
		e.waitIdleStreams(t, "n1", 2)
		n.cancel()
		for _, rs := range []runStream{a, b} {
			if _, err := rs.Recv(); err == nil {
				t.Fatal("warm stream still open after its connection was fenced")
			}
		}
	})
	t.Run("drain", func(t *testing.T) {
		e := startEdge(t, testConfig())
		n := e.connect(t, h)
		a, b := n.openWarm(t, n.gen), n.openWarm(t, n.gen)
		e.waitIdleStreams(t, "n1", 2)
		n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Drain{Drain: &nodev1.Drain{Reason: "test"}}})
		for _, rs := range []runStream{a, b} {
			if m, err := rs.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("warm stream of a draining node: %v, %v; want its end", m, err)
			}
		}
		rs := n.openWarm(t, n.gen)
		if _, err := rs.Recv(); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("warm stream opened while draining: %v, want FailedPrecondition", err)
		}
		if got := e.idleStreams("n1"); got != 0 {
			t.Fatalf("%d idle streams of a draining node, want 0", got)
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		e := startEdge(t, testConfig())
		n := e.connect(t, h)
		a, b := n.openWarm(t, n.gen), n.openWarm(t, n.gen)
		e.waitIdleStreams(t, "n1", 2)
		if err := e.stop(); err != nil {
			t.Fatal(err)
		}
		for _, rs := range []runStream{a, b} {
			if _, err := rs.Recv(); err == nil {
				t.Fatal("warm stream still open after the edge stopped")
			}
		}
	})
}

// Cancelling a run on a warm stream sends Cancel down that stream and on
// the control stream, frees its slot at once, and ends the stream.
func TestWarmRunCancel(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL, 2, "m-big")))
	rs := n.openWarm(t, n.gen)
	e.waitIdleStreams(t, "n1", 1)
	res := e.dispatchAsync(context.Background(), chatReq("m-big"))
	d := warmDispatch(t, rs)
	got := wait(t, res)
	if got.err != nil {
		t.Fatal(got.err)
	}
	defer got.run.Close("test")
	sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200}}})
	got.run.Cancel("client gone")
	if c := n.nextCancel(t); c.GetRunId() != d.GetRunId() {
		t.Fatalf("control Cancel of %q, want %q", c.GetRunId(), d.GetRunId())
	}
	down, err := drainRun(t, rs)
	if !errors.Is(err, io.EOF) || len(down) != 1 || down[0].GetCancel().GetRunId() != d.GetRunId() {
		t.Fatalf("warm stream after the cancel: %v, %v; want one Cancel of %q, then its end", down, err, d.GetRunId())
	}
	if got := e.inFlight("n1", "p"); got != 0 {
		t.Fatalf("in-flight %d after the cancel, want 0", got)
	}
}

// A Dispatch the node refuses on its warm stream (RunUp.refused) is
// handled as a control-stream refusal: the request is admitted again,
// without that candidate, and served by another provider; its slot is
// freed. (With max_retries 0 the run is handed out at once, and the
// refusal ends it: Recv returns ErrDispatchRefused.)
func TestWarmRunRefused(t *testing.T) {
	t.Run("admitted again", func(t *testing.T) {
		cfg := testConfig()
		one := 1
		cfg.MaxRetries = &one
		e := startEdge(t, cfg)
		a := e.connect(t, hello("n1", prov("a", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m-big")))
		b := e.connect(t, hello("n2", prov("b", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m-big")))
		rs := a.openWarm(t, a.gen)
		e.waitIdleStreams(t, "n1", 1)
		res := e.dispatchAsync(context.Background(), chatReq("m-big"))
		d := warmDispatch(t, rs) // provider "a" first: ties go by provider id
		sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_Refused{Refused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "unknown provider"}}})
		if _, err := drainRun(t, rs); !errors.Is(err, io.EOF) {
			t.Fatalf("refused warm stream: %v, want its end", err)
		}
		d2 := b.nextDispatch(t)
		if d2.GetProviderId() != "b" || d2.GetRunId() == d.GetRunId() {
			t.Fatalf("admitted again as %v", d2)
		}
		rs2 := b.openRun(t, d2.GetRunId(), b.gen)
		sendUp(t, rs2, events(event(nodev1.RunEvent_TYPE_DELTA, "from b")))
		got := wait(t, res)
		if got.err != nil {
			t.Fatalf("Dispatch: %v", got.err)
		}
		defer got.run.Close("test")
		if got.run.Info().ProviderID != "b" {
			t.Fatalf("served by %q, want b", got.run.Info().ProviderID)
		}
		if got := e.inFlight("n1", "a"); got != 0 {
			t.Fatalf("refusing provider's in-flight %d, want 0", got)
		}
	})
	t.Run("no read-ahead", func(t *testing.T) {
		e := startEdge(t, testConfig())
		n := e.connect(t, hello("n1", prov("p", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, 2, "m-big")))
		rs := n.openWarm(t, n.gen)
		e.waitIdleStreams(t, "n1", 1)
		res := e.dispatchAsync(context.Background(), chatReq("m-big"))
		d := warmDispatch(t, rs)
		got := wait(t, res)
		if got.err != nil {
			t.Fatal(got.err)
		}
		defer got.run.Close("test")
		sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_Refused{Refused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "draining"}}})
		if _, err := got.run.Recv(); !errors.Is(err, ErrDispatchRefused) {
			t.Fatalf("Recv: %v, want ErrDispatchRefused", err)
		}
		if got := e.inFlight("n1", "p"); got != 0 {
			t.Fatalf("in-flight %d after the refusal, want 0", got)
		}
	})
}
