package node

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/internal/wire/nodev1"
)

// startWarmEdge is startEdge whose fake edge takes warm run streams and
// hands them to the test (fakeEdge.warm).
func startWarmEdge(t testing.TB) (*fakeEdge, string) {
	t.Helper()
	e, addr := startEdge(t)
	e.warm = make(chan *edgeRun, 16)
	return e, addr
}

// warmDown sends m down the warm stream r, as the edge does.
func (r *edgeRun) warmDown(t testing.TB, m *nodev1.EdgeMessage) {
	t.Helper()
	if err := r.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Dispatch{Dispatch: m.GetDispatch()}}); err != nil {
		t.Fatalf("edge send dispatch: %v", err)
	}
}

// isTerminal reports whether m ends its run.
func isTerminal(m *nodev1.RunUp) bool {
	if m.GetTunnelEnd() != nil || m.GetTunnelError() != nil {
		return true
	}
	for _, e := range m.GetEvents().GetEvents() {
		switch e.Type {
		case nodev1.RunEvent_TYPE_COMPLETE, nodev1.RunEvent_TYPE_ERROR, nodev1.RunEvent_TYPE_CANCELLED:
			return true
		}
	}
	return false
}

// warmRun reads a run on the warm stream r: its acknowledgement (RunOpen
// naming runID, checked) and its messages up to its terminal one. The
// node then neither sends more nor half-closes: the stream waits for the
// edge's next Dispatch or its end.
func (r *edgeRun) warmRun(t *testing.T, runID string) []*nodev1.RunUp {
	t.Helper()
	ack := r.next(t)
	if o := ack.GetOpen(); o == nil || o.RunId != runID || o.Idle || o.NodeId != "node-1" {
		t.Fatalf("warm run %s: first message %v, want its RunOpen", runID, ack)
	}
	var out []*nodev1.RunUp
	for {
		m := r.next(t)
		if m == nil {
			t.Fatalf("warm run %s: half-closed after %v, before its terminal message", runID, out)
		}
		out = append(out, m)
		if isTerminal(m) {
			return out
		}
	}
}

// noRun fails when a Run stream of its own was opened.
func noRun(t *testing.T, e *fakeEdge) {
	t.Helper()
	select {
	case r := <-e.runs:
		t.Fatalf("a run stream of its own was opened: %v", r.open)
	default:
	}
}

// After Welcome, the agent opens WarmStreams warm run streams naming its
// node and generation (RunOpen.idle, no run). A Dispatch sent down one is
// acknowledged (RunOpen naming the run) and served on that stream, as on
// a stream of its own: the provider is called with the inline body and
// the answer comes up; the one taken is replaced by a new warm stream.
// After the run's terminal message the node sends nothing and keeps the
// stream open: the edge reuses it for the next Dispatch (three runs in a
// row here) or ends it.
func TestAgentServesDispatchOnWarmStream(t *testing.T) {
	e, addr := startWarmEdge(t)
	ollama, calls := ollamaServer(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: ollama.URL, Models: []string{"served-model"}}), newTestClock(), nil)
	c := connect(t, e, 5, hour)
	var warm []*edgeRun
	for range WarmStreams {
		r := recv(t, e.warm, "warm run stream")
		if o := r.open; !o.Idle || o.RunId != "" || o.NodeId != "node-1" || o.Generation != 5 {
			t.Fatalf("warm RunOpen %v", o)
		}
		warm = append(warm, r)
	}
	r := warm[0]
	for i, id := range []string{"r1", "r2", "r3"} {
		r.warmDown(t, inlineDispatchMsg(id, "ol", normalized, `{"model":"alias","messages":[{"role":"user","content":"hello"}],"stream":true}`))
		if i == 0 {
			next := recv(t, e.warm, "replacement warm run stream")
			if !next.open.Idle || next.open.Generation != 5 {
				t.Fatalf("replacement RunOpen %v", next.open)
			}
		}
		var types []nodev1.RunEvent_Type
		text := ""
		for _, ev := range eventsOf(r.warmRun(t, id)) {
			types = append(types, ev.Type)
			text += ev.Text
		}
		want := []nodev1.RunEvent_Type{nodev1.RunEvent_TYPE_STARTED, nodev1.RunEvent_TYPE_DELTA, nodev1.RunEvent_TYPE_DELTA,
			nodev1.RunEvent_TYPE_USAGE, nodev1.RunEvent_TYPE_COMPLETE}
		if !slices.Equal(types, want) || text != "Hi there" {
			t.Errorf("run %s: events %v text %q", id, types, text)
		}
	}
	r.end <- nil
	if m := r.next(t); m != nil {
		t.Errorf("after the edge ended the stream: %v", m)
	}
	if calls.Load() != 3 {
		t.Errorf("%d provider calls, want 3", calls.Load())
	}
	noRun(t, e)
	for _, m := range drainIn(c) {
		if m.GetDispatchRefused() != nil {
			t.Errorf("refusal on the control stream: %v", m)
		}
	}
}

// drainIn returns the messages c received so far.
func drainIn(c *edgeConn) []*nodev1.NodeMessage {
	var out []*nodev1.NodeMessage
	for {
		select {
		case m := <-c.in:
			out = append(out, m)
		default:
			return out
		}
	}
}

// A Dispatch down a warm stream is checked as one on the control stream
// (TestAgentRefusesDispatches), and refused on that stream
// (RunUp.refused): unknown provider, path mismatch, no run id, unknown
// operation, a run id already in flight, and any after Drain.
func TestAgentRefusesDispatchOnWarmStream(t *testing.T) {
	e, addr := startWarmEdge(t)
	pc, _ := hangingProvider(t, tunnel)
	a := startAgent(t, testConfig(addr, pc), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	nextWarm := func() *edgeRun { return recv(t, e.warm, "warm run stream") }
	// A run in flight, for the duplicate.
	busy := nextWarm()
	busy.warmDown(t, inlineDispatchMsg("busy", "p", tunnel, `{}`))

	noOp := dispatchMsg("r4", "p", tunnel)
	noOp.GetDispatch().Operation = nodev1.Operation_OPERATION_UNSPECIFIED
	cases := []struct {
		msg  *nodev1.EdgeMessage
		want error
	}{
		{dispatchMsg("r1", "nope", tunnel), ErrUnknownProvider},
		{dispatchMsg("r2", "p", normalized), ErrPathMismatch},
		{dispatchMsg("", "p", tunnel), ErrMissingRunID},
		{noOp, ErrUnsupportedOperation},
		{inlineDispatchMsg("busy", "p", tunnel, `{}`), ErrDuplicateRun},
	}
	busy.next(t) // its acknowledgement
	check := func(msg *nodev1.EdgeMessage, want error) {
		t.Helper()
		r := nextWarm()
		r.warmDown(t, msg)
		rest := r.rest(t)
		if len(rest) != 1 || rest[0].GetRefused() == nil || rest[0].GetRefused().RunId != msg.GetDispatch().RunId ||
			!strings.Contains(rest[0].GetRefused().Reason, want.Error()) {
			t.Errorf("dispatch %v: got %v, want one refusal for %v, then the half-close", msg.GetDispatch(), rest, want)
		}
		r.end <- nil
	}
	for _, tc := range cases {
		check(tc.msg, tc.want)
	}
	// After Drain: refused (the Drain goes first on the control stream).
	r := nextWarm()
	a.Drain("test")
	for m := c.next(t); m.GetDrain() == nil; m = c.next(t) {
	}
	r.warmDown(t, inlineDispatchMsg("late", "p", tunnel, `{}`))
	rest := r.rest(t)
	if len(rest) != 1 || !strings.Contains(rest[0].GetRefused().GetReason(), ErrDraining.Error()) {
		t.Errorf("dispatch after Drain: got %v, want a refusal for %v", rest, ErrDraining)
	}
	r.end <- nil
	noRun(t, e)
	busy.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{RunId: "busy"}}})
	busy.end <- nil
}

// A run on a warm stream is cancelled by a Cancel on the control stream
// or down its stream, as any run.
func TestAgentCancelsRunOnWarmStream(t *testing.T) {
	for _, via := range []string{"control", "run"} {
		t.Run(via, func(t *testing.T) {
			e, addr := startWarmEdge(t)
			pc, gone := hangingProvider(t, tunnel)
			startAgent(t, testConfig(addr, pc), newTestClock(), nil)
			c := connect(t, e, 1, hour)
			r := recv(t, e.warm, "warm run stream")
			r.warmDown(t, inlineDispatchMsg("r1", "p", tunnel, `{}`))
			r.next(t) // its acknowledgement
			// The head carries the first data when both were at hand.
			if head := r.next(t).GetTunnelHead(); head == nil {
				t.Fatal("want the head")
			} else if len(head.GetData()) == 0 && r.next(t).GetTunnelData() == nil {
				t.Fatal("want data")
			}
			if via == "control" {
				c.send(t, cancelMsg("r1"))
			} else if err := r.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{RunId: "r1"}}}); err != nil {
				t.Fatal(err)
			}
			recv(t, gone, "provider request to be aborted")
			if m := r.next(t); m.GetTunnelError() == nil {
				t.Fatalf("after cancel: %v, want TunnelError", m)
			}
			r.end <- nil // the edge ends a cancelled run's stream
		})
	}
}

// TestRegression_IdleWarmStreamIsNoRunInFlight: a run whose terminal
// frame went up a warm stream is over, though its stream stays open for
// the edge's next Dispatch: a Drain finds no run in flight, and says so.
// (iop dev's Ctrl-C logged "every run in flight finished" instead of "no
// run in flight".) But the node disconnects only once the edge ended the
// stream, which it does for a draining connection after it read the run's
// end: a node that disconnected at once cut answers whose last frame the
// edge had not read yet (TestRegression_DrainKeepsAnswersFinishedAsItBegan
// in internal/process, with a real edge).
func TestRegression_IdleWarmStreamIsNoRunInFlight(t *testing.T) {
	e, addr := startWarmEdge(t)
	ollama, _ := ollamaServer(t)
	logs := &logRecorder{}
	a := startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: ollama.URL, Models: []string{"served-model"}}), newTestClock(), logs)
	c := connect(t, e, 1, hour)
	r := recv(t, e.warm, "warm run stream")
	r.warmDown(t, inlineDispatchMsg("r1", "ol", normalized, `{"messages":[{"role":"user","content":"hello"}]}`))
	r.warmRun(t, "r1")
	a.Drain("test")
	for m := c.next(t); m.GetDrain() == nil; m = c.next(t) {
	}
	select {
	case <-c.done:
		t.Fatal("the node disconnected before the edge ended the stream of the run that finished: the edge may not have read its end")
	default:
	}
	r.end <- nil // the edge read the run's end and ends its stream, as for every stream of a draining connection
	recv(t, c.done, "the control stream to end")
	if !logs.hasMessage("drained: no run in flight; disconnecting") {
		t.Error(`the drain did not log "no run in flight"`)
	}
}

// A warm stream the edge ends without a Dispatch (its connection drains or
// ended, the edge refused it) is not replaced: the node does not loop
// opening streams an edge refuses. The plain fake edge refuses every warm
// stream, as an edge without them does; the agent still takes dispatches
// on the control stream.
func TestAgentDoesNotReopenRefusedWarmStreams(t *testing.T) {
	e, addr := startWarmEdge(t)
	ollama, _ := ollamaServer(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: ollama.URL, Models: []string{"served-model"}}), newTestClock(), nil)
	c := connect(t, e, 1, hour)
	for range WarmStreams {
		r := recv(t, e.warm, "warm run stream")
		r.end <- nil // ended without a Dispatch
	}
	c.send(t, inlineDispatchMsg("r1", "ol", normalized, `{"messages":[{"role":"user","content":"hello"}]}`))
	r := recv(t, e.runs, "run stream of its own")
	if r.open.RunId != "r1" || r.open.Idle {
		t.Fatalf("RunOpen %v", r.open)
	}
	r.rest(t)
	r.end <- nil
	select {
	case w := <-e.warm:
		t.Fatalf("a warm stream was opened again: %v", w.open)
	case <-time.After(50 * time.Millisecond):
	}
}

// A warm stream serves run after run; each run's work context is a child
// of the stream's, so one left uncancelled at the run's end stays in the
// stream's context (with its children and channel) until the stream ends:
// a node whose warm streams the edge kept reusing grew by every run it
// served. The live heap after 800 more runs on one warm stream stays
// within a bound far below that growth (about 470 B a run).
func TestRegression_WarmStreamKeepsNoEndedRun(t *testing.T) {
	e, addr := startWarmEdge(t)
	ollama, _ := ollamaServer(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: ollama.URL, Models: []string{"served-model"}}), newTestClock(), nil)
	connect(t, e, 1, hour)
	r := recv(t, e.warm, "warm run stream")
	n := 0
	serve := func(runs int) {
		for range runs {
			n++
			id := fmt.Sprintf("r%d", n)
			r.warmDown(t, inlineDispatchMsg(id, "ol", normalized, `{"messages":[{"role":"user","content":"hello"}]}`))
			r.warmRun(t, id)
		}
	}
	liveHeap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC() // a second cycle frees what the first one's finalizers released
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	serve(100) // connections, pools and buffers grown
	before := liveHeap()
	const more = 800
	serve(more)
	after := liveHeap()
	if grown := int64(after) - int64(before); grown > 128<<10 {
		t.Fatalf("live heap grew %d bytes (%d a run) over %d runs on one warm stream", grown, grown/more, more)
	}
}

// One warm stream serves run after run with one reader: a body that came
// inline, one sent in chunks down the stream after the Dispatch, a run
// cancelled down the stream before its body came, then a Dispatch the node
// refuses on the reused stream (the stream's goroutine reads it to its end
// while the reader waits between runs). Each run gets its own body and
// answer, the cancelled one ends CANCELLED, and the refusal half-closes.
func TestWarmStreamReaderServesRunAfterRun(t *testing.T) {
	e, addr := startWarmEdge(t)
	ollama, calls := ollamaServer(t)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "ol", Type: "ollama", BaseURL: ollama.URL, Models: []string{"served-model"}}), newTestClock(), nil)
	connect(t, e, 1, hour)
	r := recv(t, e.warm, "warm run stream")
	text := func(msgs []*nodev1.RunUp) (s string, last nodev1.RunEvent_Type) {
		for _, ev := range eventsOf(msgs) {
			s += ev.Text
			last = ev.Type
		}
		return s, last
	}
	const complete, cancelled = nodev1.RunEvent_TYPE_COMPLETE, nodev1.RunEvent_TYPE_CANCELLED
	r.warmDown(t, inlineDispatchMsg("r1", "ol", normalized, `{"messages":[{"role":"user","content":"hello"}]}`))
	if s, last := text(r.warmRun(t, "r1")); s != "Hi there" || last != complete {
		t.Errorf("r1 (inline): %q, last %v", s, last)
	}
	r.warmDown(t, dispatchMsg("r2", "ol", normalized))
	r.sendBody(t, `{"messages":[{"role":"user",`, `"content":"hello"}]}`)
	if s, last := text(r.warmRun(t, "r2")); s != "Hi there" || last != complete {
		t.Errorf("r2 (body in chunks): %q, last %v", s, last)
	}
	r.warmDown(t, inlineDispatchMsg("r3", "ol", normalized, `{"messages":[{"role":"user","content":"hello"}]}`))
	if s, last := text(r.warmRun(t, "r3")); s != "Hi there" || last != complete {
		t.Errorf("r3 (inline again): %q, last %v", s, last)
	}
	r.warmDown(t, dispatchMsg("r4", "ol", normalized))
	if err := r.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{RunId: "r4", Reason: "client gone"}}}); err != nil {
		t.Fatal(err)
	}
	if _, last := text(r.warmRun(t, "r4")); last != cancelled {
		t.Errorf("r4 (cancelled before its body): last %v, want CANCELLED", last)
	}
	r.warmDown(t, inlineDispatchMsg("r5", "nope", normalized, `{}`))
	rest := r.rest(t)
	if len(rest) != 1 || rest[0].GetRefused().GetRunId() != "r5" || !strings.Contains(rest[0].GetRefused().GetReason(), ErrUnknownProvider.Error()) {
		t.Errorf("r5 (unknown provider): %v, want one refusal, then the half-close", rest)
	}
	r.end <- nil
	if n := calls.Load(); n != 3 {
		t.Errorf("%d provider calls, want 3", n)
	}
	noRun(t, e)
}

// TestRegression_CancelledUploadFreesItsWarmStream: a streamed body (a
// transcription's multipart upload) whose run is cancelled before its
// first chunk comes down was delivered to nobody, and the stream's one
// reader blocked for ever writing the chunk into its pipe: the warm
// stream never read the next Dispatch, and the node's Run never returned
// (a make test hung 13 minutes in an in-process node's shutdown). The
// pipe now fails once the run's work ends: the run ends cancelled, the
// same stream serves the next run, and the node stops.
func TestRegression_CancelledUploadFreesItsWarmStream(t *testing.T) {
	e, addr := startWarmEdge(t)
	const sse = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sse)
	}))
	t.Cleanup(up.Close)
	startAgent(t, testConfig(addr, ProviderConfig{ID: "p", Type: "vllm", BaseURL: up.URL, Models: []string{"served-model"}}), newTestClock(), nil)
	connect(t, e, 1, hour)
	r := recv(t, e.warm, "warm run stream")

	upload := dispatchMsg("upload", "p", tunnel)
	upload.GetDispatch().Operation, upload.GetDispatch().Stream = nodev1.Operation_OPERATION_TRANSCRIPTION, false
	r.warmDown(t, upload)
	if err := r.stream.Send(&nodev1.RunDown{Msg: &nodev1.RunDown_Cancel{Cancel: &nodev1.Cancel{RunId: "upload", Reason: "client gone"}}}); err != nil {
		t.Fatal(err)
	}
	r.sendBody(t, "--b\r\nfirst part", "second part", "--b--\r\n")
	if last := r.warmRun(t, "upload"); last[len(last)-1].GetTunnelError() == nil {
		t.Fatalf("cancelled upload ended with %v, want TunnelError", last[len(last)-1])
	}

	r.warmDown(t, inlineDispatchMsg("chat", "p", tunnel, `{"model":"alias","stream":true}`))
	if _, body, complete := tunnelAnswer(r.warmRun(t, "chat")); !complete || body != sse {
		t.Fatalf("next run on the stream: complete %v body %q", complete, body)
	}
	r.end <- nil
}
