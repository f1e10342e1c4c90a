package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
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

// ackWarm acknowledges d's run on the warm stream rs, as the node does
// (RunOpen naming it) before anything of the run.
func (n *fakeNode) ackWarm(t *testing.T, rs runStream, d *nodev1.Dispatch) {
	t.Helper()
	sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{RunId: d.GetRunId(), NodeId: n.id, Generation: n.gen}}})
}

// A dispatch takes an idle warm stream of the selected connection: its
// Dispatch goes down that stream (not on the control stream), Dispatch
// returns the run at once (no RunOpen to wait for), the node's answer
// comes up the same stream, and its end releases the slot. After that
// clean end the stream is idle again and the next dispatch goes down it;
// a message of the earlier run that comes late, before the node
// acknowledged the next one, is never read as the next run's. A dispatch
// finding no idle stream goes on the control stream, as before.
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
	n.ackWarm(t, rs, d)
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "hi")))
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}))
	msgs, err := recvAll(r)
	if !errors.Is(err, io.EOF) || len(msgs) != 2 || first(msgs[0]).Text != "hi" || !msgs[1].Ends {
		t.Fatalf("Recv: %v, %v; want the delta and the complete, then io.EOF", msgs, err)
	}
	if got := e.inFlight("n1", "p"); got != 0 {
		t.Fatalf("in-flight %d after the run's end, want 0", got)
	}
	e.waitIdleStreams(t, "n1", 1) // reused

	// The next run goes down the same stream; a late message of the first
	// comes before the node's acknowledgement of the second.
	res = e.dispatchAsync(context.Background(), chatReq("m-big"))
	d2 := warmDispatch(t, rs)
	if d2.GetRunId() == d.GetRunId() {
		t.Fatalf("second run has the first's id %q", d.GetRunId())
	}
	got = wait(t, res)
	if got.err != nil {
		t.Fatalf("Dispatch: %v", got.err)
	}
	r2 := got.run
	defer r2.Close("test")
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "late, of the first run")))
	n.ackWarm(t, rs, d2)
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "two")))

	// No idle stream now: the control stream.
	r3, rs3, _ := e.startRun(t, n, chatReq("m-big"))
	sendUp(t, rs3, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE}))
	if _, err := recvAll(r3); !errors.Is(err, io.EOF) {
		t.Fatalf("control-stream run: %v", err)
	}

	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE}))
	msgs, err = recvAll(r2)
	if !errors.Is(err, io.EOF) || len(msgs) != 2 || first(msgs[0]).Text != "two" || !msgs[1].Ends {
		t.Fatalf("second run: %v, %v; want its delta and complete only, then io.EOF", msgs, err)
	}
}

// One warm stream carries N runs in a row, each after the last one's
// clean end (a complete event, a tunnel end): every one is answered, in
// order, and the slot is free after each.
func TestWarmStreamSequentialRuns(t *testing.T) {
	for _, path := range []nodev1.ExecutionPath{nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL} {
		t.Run(path.String(), func(t *testing.T) {
			e := startEdge(t, testConfig())
			n := e.connect(t, hello("n1", prov("p", path, 2, "m-big")))
			rs := n.openWarm(t, n.gen)
			const runs = 5
			seen := map[string]bool{}
			for i := range runs {
				e.waitIdleStreams(t, "n1", 1)
				res := e.dispatchAsync(context.Background(), chatReq("m-big"))
				d := warmDispatch(t, rs)
				if seen[d.GetRunId()] {
					t.Fatalf("run %d: id %q again", i, d.GetRunId())
				}
				seen[d.GetRunId()] = true
				got := wait(t, res)
				if got.err != nil {
					t.Fatalf("run %d: %v", i, got.err)
				}
				n.ackWarm(t, rs, d)
				text := fmt.Sprintf("answer %d", i)
				if path == nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL {
					sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200}}})
					sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte(text)}}})
					sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}})
				} else {
					sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, text)))
					sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE}))
				}
				msgs, err := recvAll(got.run)
				got.run.Close("completed")
				var all string
				for _, m := range msgs {
					all += first(m).Text + string(first(m).Data)
				}
				if !errors.Is(err, io.EOF) || !strings.Contains(all, text) || !msgs[len(msgs)-1].Ends {
					t.Fatalf("run %d: %v (%q), %v; want %q, then io.EOF", i, msgs, all, err, text)
				}
				if got := e.inFlight("n1", "p"); got != 0 {
					t.Fatalf("run %d: in-flight %d after its end", i, got)
				}
			}
			e.waitIdleStreams(t, "n1", 1)
		})
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
	n.ackWarm(t, rs, d)
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
	if got := e.idleStreams("n1"); got != 0 {
		t.Fatalf("%d idle streams: a cancelled run's stream was reused", got)
	}
}

// A warm stream whose run ended otherwise than cleanly is not reused: it
// ends, as a run's own stream does. An error event, a tunnel end carrying
// the provider's error, and a node that aborts (half-closes) before its
// terminal message.
func TestWarmStreamNotReusedAfterFailure(t *testing.T) {
	for _, c := range []struct {
		name string
		path nodev1.ExecutionPath
		last *nodev1.RunUp // nil: the node half-closes
	}{
		{"error event", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: "boom", Status: 500})},
		{"tunnel end with provider error", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL,
			&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{ProviderError: "boom"}}}},
		{"tunnel error", nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL,
			&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: "boom", Status: 502}}}},
		{"aborted", nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := startEdge(t, testConfig())
			n := e.connect(t, hello("n1", prov("p", c.path, 2, "m-big")))
			rs := n.openWarm(t, n.gen)
			e.waitIdleStreams(t, "n1", 1)
			res := e.dispatchAsync(context.Background(), chatReq("m-big"))
			d := warmDispatch(t, rs)
			got := wait(t, res)
			if got.err != nil {
				t.Fatal(got.err)
			}
			defer got.run.Close("test")
			n.ackWarm(t, rs, d)
			if c.path == nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL {
				sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200}}})
			} else {
				sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "a")))
			}
			if c.last != nil {
				sendUp(t, rs, c.last)
			} else if err := rs.CloseSend(); err != nil {
				t.Fatal(err)
			}
			recvAll(got.run)
			ended := make(chan error, 1)
			go func() {
				_, err := drainRun(t, rs)
				ended <- err
			}()
			if err := wait(t, ended); !errors.Is(err, io.EOF) {
				t.Fatalf("stream after the run: %v, want its end", err)
			}
			if got := e.idleStreams("n1"); got != 0 {
				t.Fatalf("%d idle streams, want 0", got)
			}
		})
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
