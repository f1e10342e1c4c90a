package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	normalized = nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED
	tunnel     = nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL
)

func TestHelloRefused(t *testing.T) {
	cfg := testConfig()
	cfg.Tokens = []NodeToken{{Token: "good-token"}}
	e := startEdge(t, cfg)
	good := func(node string) *nodev1.Hello {
		h := hello(node, prov("p1", normalized, 1, "m1"))
		h.Token = "good-token"
		return h
	}
	tests := []struct {
		name   string
		mutate func(h *nodev1.Hello)
		code   codes.Code
		reason string
	}{
		{"empty node id", func(h *nodev1.Hello) { h.NodeId = "" }, codes.InvalidArgument, "empty node_id"},
		{"no providers", func(h *nodev1.Hello) { h.Providers = nil }, codes.InvalidArgument, "no providers"},
		{"duplicate provider ids", func(h *nodev1.Hello) {
			h.Providers = append(h.Providers, prov("p1", tunnel, 1, "m2"))
		}, codes.InvalidArgument, `duplicate provider id "p1"`},
		{"empty provider id", func(h *nodev1.Hello) { h.Providers[0].Id = "" }, codes.InvalidArgument, "empty id"},
		{"negative capacity", func(h *nodev1.Hello) { h.Providers[0].Capacity = -1 }, codes.InvalidArgument, "capacity -1 is negative"},
		{"negative long capacity", func(h *nodev1.Hello) { h.Providers[0].LongCapacity = -2 }, codes.InvalidArgument, "long_capacity -2 is negative"},
		{"no models", func(h *nodev1.Hello) { h.Providers[0].Models = nil }, codes.InvalidArgument, `provider "p1": no models`},
		{"empty model", func(h *nodev1.Hello) { h.Providers[0].Models = []string{"m1", ""} }, codes.InvalidArgument, "empty model name"},
		{"unknown execution path", func(h *nodev1.Hello) {
			h.Providers[0].ExecutionPath = nodev1.ExecutionPath_EXECUTION_PATH_UNSPECIFIED
		}, codes.InvalidArgument, "unknown execution_path"},
		{"negative runtime concurrency", func(h *nodev1.Hello) { h.RuntimeConcurrency = -1 }, codes.InvalidArgument, "runtime_concurrency"},
		{"bad token", func(h *nodev1.Hello) { h.Token = "bad" }, codes.PermissionDenied, "token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := good("n-" + strings.ReplaceAll(tc.name, " ", "-"))
			tc.mutate(h)
			n := e.dial(t, h)
			m, err := n.stream.Recv()
			if err != nil {
				t.Fatalf("Recv: %v, want HelloRefused", err)
			}
			if r := m.GetHelloRefused(); r == nil || !strings.Contains(r.GetReason(), tc.reason) {
				t.Fatalf("got %v, want HelloRefused containing %q", m, tc.reason)
			}
			_, err = n.stream.Recv()
			if status.Code(err) != tc.code {
				t.Fatalf("stream ended with %v, want code %v", err, tc.code)
			}
			// The edge keeps serving.
			e.connect(t, good("ok-after-"+strings.ReplaceAll(tc.name, " ", "-")))
		})
	}
}

func TestHelloDefaultsCapacity(t *testing.T) {
	e := startEdge(t, testConfig())
	h := hello("n1", prov("p-default", normalized, 0, "m1"), prov("p-set", normalized, 3, "m1"))
	h.RuntimeConcurrency = 4
	h.Providers[1].LongCapacity = 2
	e.connect(t, h)
	e.connect(t, hello("n2", prov("p-one", normalized, 0, "m1")))
	snap := e.svc.Snapshot()
	for _, want := range []struct {
		node, id       string
		capacity, long int
	}{{"n1", "p-default", 4, 4}, {"n1", "p-set", 3, 2}, {"n2", "p-one", 1, 1}} {
		p, _ := providerOf(snap, want.node, want.id)
		if p.Capacity != want.capacity || p.LongCapacity != want.long {
			t.Errorf("%s/%s: capacity %d long %d, want %d and %d", want.node, want.id, p.Capacity, p.LongCapacity, want.capacity, want.long)
		}
	}
}

func TestGenerationIncreasesOnReconnect(t *testing.T) {
	e := startEdge(t, testConfig())
	h := hello("n1", prov("p1", normalized, 1, "m1"))
	first := e.connect(t, h)
	second := e.connect(t, h)
	if second.gen <= first.gen {
		t.Fatalf("reconnect generation %d, want > %d", second.gen, first.gen)
	}
	// The replaced connection is closed by the edge.
	if err := first.waitClosed(t); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("old connection ended with %v, want FailedPrecondition", err)
	}
	other := e.connect(t, hello("n2", prov("p1", normalized, 1, "m1")))
	if other.gen <= second.gen {
		t.Errorf("next node's generation %d, want > %d", other.gen, second.gen)
	}
	snap := e.svc.Snapshot()
	if len(snap.Nodes) != 2 || snap.Nodes[0].Generation != second.gen {
		t.Errorf("nodes %+v, want n1 at generation %d", snap.Nodes, second.gen)
	}
	// The old generation's late fence must not touch the live one.
	if p, _ := providerOf(snap, "n1", "p1"); p.Status != "available" || p.Generation != second.gen {
		t.Errorf("n1/p1 %+v, want available at generation %d", p, second.gen)
	}
	third := e.connect(t, h)
	if third.gen <= other.gen {
		t.Errorf("third generation %d, want > %d", third.gen, other.gen)
	}
}

func TestDispatchNormalized(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 2, "m-small")))
	req := chatReq("chat")
	req.Headers = map[string]string{"Accept": "text/event-stream"}
	req.EstimatedInputTokens = 12
	run, rs, d := e.startRun(t, n, req)

	if d.GetProviderId() != "p1" || d.GetServedModel() != "m-small" || d.GetExecutionPath() != normalized ||
		d.GetOperation() != nodev1.Operation_OPERATION_CHAT || !d.GetStream() || d.GetHeaders()["Accept"] != "text/event-stream" {
		t.Errorf("dispatch %v", d)
	}
	info := run.Info()
	want := contract.DispatchInfo{RunID: d.GetRunId(), NodeID: "n1", ProviderID: "p1", ProviderType: "sim", ServedModel: "m-small",
		Generation: n.gen, Path: contract.PathNormalized, QueueReason: "immediate"}
	if info != want {
		t.Errorf("Info() = %+v, want %+v", info, want)
	}
	if !strings.HasPrefix(info.RunID, "run_") || len(info.RunID) != 4+32 {
		t.Errorf("run id %q", info.RunID)
	}
	if got := e.inFlight("n1", "p1"); got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}

	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_DELTA, "hel"), event(nodev1.RunEvent_TYPE_DELTA, "lo")))
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: 3, CompletionTokens: 2}))
	for i := 0; i < 3; i++ {
		if _, err := run.Recv(); err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if got := e.inFlight("n1", "p1"); got != 1 {
			t.Fatalf("in flight %d before the terminal event, want 1", got)
		}
	}
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}))
	m, err := run.Recv()
	if err != nil || first(m).Kind != contract.EventEnd || first(m).FinishReason != "stop" {
		t.Fatalf("Recv = %v, %v; want the complete event", m, err)
	}
	// Released before Recv returned the terminal event.
	if snap := e.svc.Snapshot(); snap.Leases != 0 || e.inFlight("n1", "p1") != 0 {
		t.Fatalf("after complete: %d leases, in flight %d; want 0", snap.Leases, e.inFlight("n1", "p1"))
	}
	if _, err := run.Recv(); err != io.EOF {
		t.Fatalf("Recv after terminal = %v, want io.EOF", err)
	}
	// The edge ends the run stream cleanly, without a Cancel.
	if down, err := drainRun(t, rs); err != io.EOF || len(down) != 0 {
		t.Fatalf("run stream got %v then %v, want a clean end", down, err)
	}
	run.Close("done") // a no-op now: no Cancel goes to the node
	_, _, d2 := e.startRun(t, n, chatReq("m-small"))
	if d2.GetServedModel() != "m-small" {
		t.Errorf("second dispatch %v", d2)
	}
}

func TestDispatchTunnel(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", tunnel, 1, "gpt-x")))
	run, rs, d := e.startRun(t, n, chatReq("gpt-x"))
	if run.Info().Path != contract.PathTunnel || d.GetExecutionPath() != tunnel {
		t.Fatalf("path %v / %v, want tunnel", run.Info().Path, d.GetExecutionPath())
	}
	sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200, Headers: map[string]string{"Content-Type": "text/event-stream"}}}})
	sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte("data: {}\n\n")}}})
	sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte("data: [DONE]\n\n")}}})
	sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}})
	got, err := recvAll(run)
	if err != io.EOF {
		t.Fatalf("Recv ended with %v, want io.EOF", err)
	}
	if len(got) != 4 || first(got[0]).Kind != contract.EventHead || first(got[0]).Status != 200 ||
		first(got[2]).Kind != contract.EventData || string(first(got[2]).Data) != "data: [DONE]\n\n" || first(got[3]).Kind != contract.EventEnd {
		t.Fatalf("got %v", got)
	}
	if e.inFlight("n1", "p1") != 0 {
		t.Fatal("lease not released after TunnelEnd")
	}
}

func TestTunnelErrorReleases(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", tunnel, 1, "gpt-x")))
	run, rs, _ := e.startRun(t, n, chatReq("gpt-x"))
	sendUp(t, rs, &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: "upstream 500", Status: 502}}})
	m, err := run.Recv()
	if err != nil || first(m).Kind != contract.EventFailure || first(m).Status != 502 {
		t.Fatalf("Recv = %v, %v", m, err)
	}
	if e.inFlight("n1", "p1") != 0 {
		t.Fatal("lease not released after TunnelError")
	}
}

// TestBodyInlineOrChunked: a body of at most 64 KiB goes in the Dispatch
// message and nothing but the run's end comes down its run stream; a larger
// one goes down the run stream in Body chunks of at most 64 KiB, and the
// Dispatch carries none of it.
func TestBodyInlineOrChunked(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	for _, tc := range []struct {
		size  int
		sizes []int // nil: inline
	}{
		{0, nil},
		{10, nil},
		{64 << 10, nil},
		{64<<10 + 1, []int{64<<10 + 1}},
		{150000, []int{150000}},
		{2<<20 + 5, []int{1 << 20, 1 << 20, 5}},
	} {
		body := bytes.Repeat([]byte("x"), tc.size)
		req := chatReq("m1")
		req.Body = body
		res := e.dispatchAsync(context.Background(), req)
		d := n.nextDispatch(t)
		if d.GetBodyInline() != (tc.sizes == nil) {
			t.Fatalf("size %d: body_inline %v", tc.size, d.GetBodyInline())
		}
		if !d.GetBodyInline() && len(d.GetBody()) != 0 {
			t.Fatalf("size %d: a chunked body also has %d bytes inline", tc.size, len(d.GetBody()))
		}
		rs := n.openRun(t, d.GetRunId(), n.gen)
		var got []byte
		var sizes []int
		if tc.sizes != nil {
			got, sizes = e.readBody(t, d, rs)
		}
		r := wait(t, res)
		if r.err != nil {
			t.Fatal(r.err)
		}
		if tc.sizes == nil {
			got = d.GetBody()
			// The node gets nothing more on the run stream than the Cancel
			// of its end: no Body message for an inline body.
			r.run.Close("test")
			down, _ := drainRun(t, rs)
			if len(down) != 1 || down[0].GetCancel() == nil {
				t.Fatalf("size %d: run stream carried %v, want only the Cancel", tc.size, down)
			}
		} else {
			r.run.Close("test")
		}
		if !bytes.Equal(got, body) || !slices.Equal(sizes, tc.sizes) {
			t.Fatalf("size %d: got %d bytes in chunks %v, want chunks %v", tc.size, len(got), sizes, tc.sizes)
		}
		n.nextCancel(t)
	}
}

func TestNodeDisconnectMidRun(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	run, rs, _ := e.startRun(t, n, chatReq("m1"))
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	if _, err := run.Recv(); err != nil {
		t.Fatal(err)
	}
	recvd := make(chan error, 1)
	go func() {
		_, err := run.Recv()
		recvd <- err
	}()
	// The control stream dies; the run stream itself stays open.
	n.cancel()
	if err := wait(t, recvd); !errors.Is(err, ErrNodeGone) {
		t.Fatalf("Recv = %v, want ErrNodeGone", err)
	}
	snap := e.waitUntil(t, "node gone", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	// Its lease released and no request waiting for it, the orphan
	// provider is forgotten.
	if p, ok := providerOf(snap, "n1", "p1"); ok || snap.Leases != 0 {
		t.Fatalf("provider %+v leases %d, want the drained orphan gone and nothing in flight", p, snap.Leases)
	}
	if _, err := run.Recv(); !errors.Is(err, ErrNodeGone) {
		t.Fatalf("later Recv = %v, want ErrNodeGone", err)
	}
	// The run stream is ended by the edge too.
	if _, err := drainRun(t, rs); err == nil {
		t.Fatal("run stream still open")
	}
	if _, err := e.svc.Dispatch(context.Background(), chatReq("m1")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("Dispatch after disconnect = %v, want ErrNoProvider", err)
	}
}

func TestRunStreamAbortedByNode(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	run, rs, _ := e.startRun(t, n, chatReq("m1"))
	if err := rs.CloseSend(); err != nil { // ends the stream without a terminal event
		t.Fatal(err)
	}
	if _, err := run.Recv(); !errors.Is(err, ErrNodeGone) {
		t.Fatalf("Recv = %v, want ErrNodeGone", err)
	}
	if e.inFlight("n1", "p1") != 0 {
		t.Fatal("lease not released")
	}
	if len(e.svc.Snapshot().Nodes) != 1 {
		t.Fatal("the node's connection must survive one run's failure")
	}
}

func TestRunOpenRefused(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	d := n.nextDispatch(t)

	for _, tc := range []struct {
		name  string
		runID string
		node  string
		gen   uint64
		code  codes.Code
	}{
		{"stale generation", d.GetRunId(), "n1", n.gen - 1, codes.FailedPrecondition},
		{"newer generation", d.GetRunId(), "n1", n.gen + 1, codes.FailedPrecondition},
		{"other node", d.GetRunId(), "n2", n.gen, codes.FailedPrecondition},
		{"unknown run", "run_nope", "n1", n.gen, codes.NotFound},
	} {
		rs := e.openRunAs(t, tc.node, tc.runID, tc.gen)
		if _, err := rs.Recv(); status.Code(err) != tc.code {
			t.Errorf("%s: Run stream ended with %v, want %v", tc.name, err, tc.code)
		}
	}
	// A first message other than RunOpen.
	rs, err := e.client.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	sendUp(t, rs, events(event(nodev1.RunEvent_TYPE_STARTED, "")))
	if _, err := rs.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no RunOpen: %v, want InvalidArgument", err)
	}

	// The right open still works, and only once.
	good := n.openRun(t, d.GetRunId(), n.gen)
	e.readBody(t, d, good)
	r := wait(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	again := n.openRun(t, d.GetRunId(), n.gen)
	if _, err := again.Recv(); status.Code(err) != codes.NotFound {
		t.Errorf("second open: %v, want NotFound", err)
	}
	r.run.Close("test")
}

// A run pending on a generation that a reconnect replaced never reached a
// provider: it is admitted again, on the new generation.
func TestDispatchPendingOnReplacedGenerationIsReadmitted(t *testing.T) {
	e := startEdge(t, testConfig())
	h := hello("n1", prov("p1", normalized, 1, "m1"))
	old := e.connect(t, h)
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	d := old.nextDispatch(t)
	fresh := e.connect(t, h) // fences the old generation and its pending run
	d2 := fresh.nextDispatch(t)
	rs := fresh.openRun(t, d2.GetRunId(), fresh.gen)
	e.readBody(t, d2, rs)
	r := wait(t, res)
	if r.err != nil {
		t.Fatalf("Dispatch = %v, want a run on the new generation", r.err)
	}
	defer r.run.Close("test")
	if r.run.Info().Generation != fresh.gen {
		t.Errorf("generation %d, want %d", r.run.Info().Generation, fresh.gen)
	}
	// The old generation's late open is refused.
	ors := old.openRun(t, d.GetRunId(), old.gen)
	if _, err := ors.Recv(); status.Code(err) != codes.NotFound {
		t.Errorf("late open: %v, want NotFound", err)
	}
	if got := e.inFlight("n1", "p1"); got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
}

// reconnectOnAdmit makes the service stop after the first `times`
// admissions until the test reconnected the node; it returns a channel
// that delivers each admitted candidate, and one to let dispatch go on.
func reconnectOnAdmit(e *testEdge, times int) (admitted chan scheduler.Candidate, proceed chan struct{}) {
	admitted, proceed = make(chan scheduler.Candidate), make(chan struct{})
	calls := 0 // touched only by the dispatching goroutine
	e.svc.afterAdmit = func(c scheduler.Candidate) {
		calls++
		if calls <= times {
			admitted <- c
			<-proceed
		}
	}
	return admitted, proceed
}

func TestStaleGenerationReadmitsOnce(t *testing.T) {
	e := startEdge(t, testConfig())
	h := hello("n1", prov("p1", normalized, 1, "m1"))
	old := e.connect(t, h)
	admitted, proceed := reconnectOnAdmit(e, 1)
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	if c := wait(t, admitted); c.Generation != old.gen {
		t.Fatalf("admitted on generation %d, want %d", c.Generation, old.gen)
	}
	fresh := e.connect(t, h) // between admission and dispatch
	proceed <- struct{}{}
	d := fresh.nextDispatch(t)
	rs := fresh.openRun(t, d.GetRunId(), fresh.gen)
	e.readBody(t, d, rs)
	r := wait(t, res)
	if r.err != nil {
		t.Fatalf("Dispatch: %v", r.err)
	}
	defer r.run.Close("test")
	if r.run.Info().Generation != fresh.gen {
		t.Fatalf("dispatched on generation %d, want %d", r.run.Info().Generation, fresh.gen)
	}
	if snap := e.svc.Snapshot(); snap.Leases != 1 {
		t.Fatalf("%d leases, want 1 (the stale one released)", snap.Leases)
	}
}

func TestStaleGenerationTwiceFails(t *testing.T) {
	e := startEdge(t, testConfig())
	h := hello("n1", prov("p1", normalized, 1, "m1"))
	e.connect(t, h)
	admitted, proceed := reconnectOnAdmit(e, 2)
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	for i := 0; i < 2; i++ {
		wait(t, admitted)
		e.connect(t, h)
		proceed <- struct{}{}
	}
	r := wait(t, res)
	if !errors.Is(r.err, ErrStaleGeneration) {
		t.Fatalf("Dispatch = %v, want ErrStaleGeneration", r.err)
	}
	if snap := e.svc.Snapshot(); snap.Leases != 0 {
		t.Fatalf("%d leases left, want 0", snap.Leases)
	}
}

// DESIGN.md: a dispatch whose run stream is not opened within the bound is
// released and admitted again, once, without the candidate that failed; with
// no other candidate the first failure is the answer.
func TestDispatchTimeoutReleases(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	d := n.nextDispatch(t) // and never opens the run
	e.clk.waitArmed(t, testDispatchTimeout, 1)
	e.clk.Advance(testDispatchTimeout - time.Millisecond)
	select {
	case r := <-res:
		t.Fatalf("Dispatch returned %v before the timeout", r.err)
	default:
	}
	e.clk.Advance(time.Millisecond)
	r := wait(t, res)
	if !errors.Is(r.err, ErrDispatchTimeout) {
		t.Fatalf("Dispatch = %v, want ErrDispatchTimeout", r.err)
	}
	if got := e.inFlight("n1", "p1"); got != 0 {
		t.Fatalf("in flight %d, want 0", got)
	}
	if c := n.nextCancel(t); c.GetRunId() != d.GetRunId() {
		t.Errorf("cancel %v, want run %s", c, d.GetRunId())
	}
	rs := n.openRun(t, d.GetRunId(), n.gen)
	if _, err := rs.Recv(); status.Code(err) != codes.NotFound {
		t.Errorf("late open: %v, want NotFound", err)
	}
}

// Regression (breaker report): a node that never opens its runs, or refuses
// them, took every request for its model while a healthy provider sat idle.
// The request is admitted again to the other candidate.
func TestRegression_SilentOrRefusingNodeDoesNotTakeTraffic(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse=%v", refuse), func(t *testing.T) {
			e := startEdge(t, testConfig())
			bad := e.connect(t, hello("a-bad", prov("a", normalized, 1, "m1")))
			good := e.connect(t, hello("z-good", prov("z", normalized, 1, "m1")))
			res := e.dispatchAsync(context.Background(), chatReq("m1"))
			d := bad.nextDispatch(t) // ties go to provider "a"
			if refuse {
				bad.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "broken"}}})
			} else {
				e.clk.waitArmed(t, testDispatchTimeout, 1)
				e.clk.Advance(testDispatchTimeout)
			}
			d2 := good.nextDispatch(t)
			rs := good.openRun(t, d2.GetRunId(), good.gen)
			e.readBody(t, d2, rs)
			r := wait(t, res)
			if r.err != nil {
				t.Fatalf("Dispatch = %v, want a run on the healthy node", r.err)
			}
			defer r.run.Close("test")
			if r.run.Info().NodeID != "z-good" || e.inFlight("a-bad", "a") != 0 {
				t.Fatalf("run on %s, bad node in flight %d", r.run.Info().NodeID, e.inFlight("a-bad", "a"))
			}
		})
	}
}

func TestDispatchRefusedReleases(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	d := n.nextDispatch(t)
	n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "provider busy"}}})
	r := wait(t, res)
	if !errors.Is(r.err, ErrDispatchRefused) || !strings.Contains(r.err.Error(), "provider busy") {
		t.Fatalf("Dispatch = %v, want ErrDispatchRefused with the reason", r.err)
	}
	if snap := e.svc.Snapshot(); snap.Leases != 0 || e.inFlight("n1", "p1") != 0 {
		t.Fatalf("leases %d, want 0", snap.Leases)
	}
	// The slot is usable again.
	e.startRun(t, n, chatReq("m1"))
}

func TestResolveErrors(t *testing.T) {
	e := startEdge(t, testConfig())
	p := prov("p1", normalized, 1, "m-small", "m-plain")
	p.Capabilities = []string{"stream", "tools"}
	e.connect(t, hello("n1", p))
	tests := []struct {
		name string
		req  func() contract.Request
		want error
		text string
	}{
		{"unknown model", func() contract.Request { return chatReq("nope") }, scheduler.ErrUnknownModel, `"nope"`},
		{"missing capability", func() contract.Request {
			r := chatReq("chat")
			r.Needs = []string{"tools", "vision"}
			return r
		}, scheduler.ErrCandidatesRejected, `capability "vision"`},
		{"empty model", func() contract.Request { return chatReq("") }, ErrInvalidRequest, "empty model"},
		{"no operation", func() contract.Request {
			r := chatReq("chat")
			r.Operation = contract.OperationUnspecified
			return r
		}, ErrInvalidRequest, "operation"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.svc.Dispatch(context.Background(), tc.req())
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("Dispatch = %v, want %v mentioning %s", err, tc.want, tc.text)
			}
			if snap := e.svc.Snapshot(); snap.Leases != 0 || snap.Waiters != 0 {
				t.Fatalf("%d leases %d waiters after a rejection, want none", snap.Leases, snap.Waiters)
			}
		})
	}
}

func TestAliasWithoutProvider(t *testing.T) {
	cfg := testConfig()
	cfg.Models["orphan"] = ModelConfig{Targets: []string{"nobody-serves-this"}}
	e := startEdge(t, cfg)
	if _, err := e.svc.Dispatch(context.Background(), chatReq("orphan")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("Dispatch = %v, want ErrNoProvider", err)
	}
}

func TestModels(t *testing.T) {
	e := startEdge(t, testConfig())
	if got, want := e.svc.Models(), []string{"chat"}; !equal(got, want) {
		t.Fatalf("Models() = %v, want %v", got, want)
	}
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "zeta", "m-small"), prov("p2", tunnel, 1, "alpha", "zeta")))
	if got, want := e.svc.Models(), []string{"alpha", "chat", "m-small", "zeta"}; !equal(got, want) {
		t.Fatalf("Models() = %v, want %v", got, want)
	}
	n.cancel()
	e.waitUntil(t, "node gone", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	if got, want := e.svc.Models(), []string{"chat"}; !equal(got, want) {
		t.Fatalf("Models() after disconnect = %v, want %v", got, want)
	}
	// A served name seen before is known: no provider now, not unknown.
	if _, err := e.svc.Dispatch(context.Background(), chatReq("zeta")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("Dispatch = %v, want ErrNoProvider", err)
	}
}

func equal(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}

func TestCloseIdempotentReleasesOnce(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 2, "m1")))
	run1, rs1, d1 := e.startRun(t, n, chatReq("m1"))
	run2, rs2, _ := e.startRun(t, n, chatReq("m1"))
	if got := e.inFlight("n1", "p1"); got != 2 {
		t.Fatalf("in flight %d, want 2", got)
	}
	run1.Close("client went away")
	run1.Close("again")
	if got := e.inFlight("n1", "p1"); got != 1 {
		t.Fatalf("in flight %d after closing one run twice, want 1", got)
	}
	if c := n.nextCancel(t); c.GetRunId() != d1.GetRunId() || !strings.Contains(c.GetReason(), "client went away") {
		t.Fatalf("cancel %v", c)
	}
	down, err := drainRun(t, rs1)
	if err != io.EOF || len(down) != 1 || down[0].GetCancel().GetRunId() != d1.GetRunId() {
		t.Fatalf("run stream got %v then %v, want one Cancel and a clean end", down, err)
	}
	if _, err := run1.Recv(); err != io.EOF {
		t.Fatalf("Recv after Close = %v, want io.EOF", err)
	}
	// A terminal event of the closed run changes nothing.
	sendUp(t, rs2, events(event(nodev1.RunEvent_TYPE_COMPLETE, "")))
	if _, err := run2.Recv(); err != nil {
		t.Fatal(err)
	}
	run2.Close("after complete")
	if snap := e.svc.Snapshot(); snap.Leases != 0 || e.inFlight("n1", "p1") != 0 {
		t.Fatalf("%d leases, want 0", snap.Leases)
	}
	// Exactly one Cancel went out: the next control message is the next dispatch.
	_, _, d3 := e.startRun(t, n, chatReq("m1"))
	if d3.GetRunId() == "" {
		t.Fatal("no dispatch")
	}
}

func TestCloseUnblocksRecv(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	run, _, _ := e.startRun(t, n, chatReq("m1"))
	recvd := make(chan error, 1)
	go func() {
		_, err := run.Recv()
		recvd <- err
	}()
	run.Close("client gone")
	if err := wait(t, recvd); err != io.EOF {
		t.Fatalf("Recv = %v, want io.EOF", err)
	}
	if e.inFlight("n1", "p1") != 0 {
		t.Fatal("lease not released")
	}
}

func TestClientCancelWhileQueued(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	run1, rs1, _ := e.startRun(t, n, chatReq("m1"))

	ctx, cancel := context.WithCancel(context.Background())
	res := e.dispatchAsync(ctx, chatReq("m1"))
	e.clk.waitArmed(t, testQueueTimeout, 1) // it is queued
	if snap := e.svc.Snapshot(); snap.Waiters != 1 || queueOf(snap, "m1").Queued != 1 {
		t.Fatalf("snapshot %+v, want one waiter", snap)
	}
	cancel()
	if r := wait(t, res); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Dispatch = %v, want context.Canceled", r.err)
	}
	if snap := e.svc.Snapshot(); snap.Waiters != 0 || snap.Leases != 1 {
		t.Fatalf("snapshot %+v, want no waiter and one lease", snap)
	}

	// A queued request gets the slot the first run frees.
	res = e.dispatchAsync(context.Background(), chatReq("m1"))
	e.clk.waitArmed(t, testQueueTimeout, 2)
	sendUp(t, rs1, events(event(nodev1.RunEvent_TYPE_COMPLETE, "")))
	if _, err := run1.Recv(); err != nil {
		t.Fatal(err)
	}
	d := n.nextDispatch(t)
	rs := n.openRun(t, d.GetRunId(), n.gen)
	e.readBody(t, d, rs)
	r := wait(t, res)
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.run.Close("test")
	if info := r.run.Info(); info.QueueReason != "queued" {
		t.Errorf("queue reason %q, want queued", info.QueueReason)
	}
}

func TestQueueTimeout(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	e.startRun(t, n, chatReq("m1"))
	res := e.dispatchAsync(context.Background(), chatReq("m1"))
	e.clk.waitArmed(t, testQueueTimeout, 1)
	e.clk.Advance(testQueueTimeout)
	if r := wait(t, res); !errors.Is(r.err, scheduler.ErrQueueTimeout) {
		t.Fatalf("Dispatch = %v, want ErrQueueTimeout", r.err)
	}
}

func TestClientCancelWhileWaitingForOpen(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	ctx, cancel := context.WithCancel(context.Background())
	res := e.dispatchAsync(ctx, chatReq("m1"))
	d := n.nextDispatch(t)
	cancel()
	if r := wait(t, res); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Dispatch = %v, want context.Canceled", r.err)
	}
	if got := e.inFlight("n1", "p1"); got != 0 {
		t.Fatalf("in flight %d, want 0", got)
	}
	if c := n.nextCancel(t); c.GetRunId() != d.GetRunId() {
		t.Fatalf("cancel %v, want run %s", c, d.GetRunId())
	}
}

func TestHeartbeats(t *testing.T) {
	cfg := testConfig()
	cfg.HeartbeatInterval = time.Second
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	for i := 1; i <= 5; i++ {
		// The node speaks every interval (here a capacity update the test
		// can see applied), so it stays connected.
		n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{ProviderId: "p1", Healthy: true, Capacity: int32(i + 1)}}})
		e.waitUntil(t, "capacity applied", func(s contract.Snapshot) bool {
			p, _ := providerOf(s, "n1", "p1")
			return p.Capacity == i+1
		})
		e.clk.Advance(time.Second)
		if m := n.nextAny(t); m.GetHeartbeat() == nil {
			t.Fatalf("got %v, want Heartbeat", m)
		}
	}
	// The last update was 1s ago: one more heartbeat at 2s of silence, and
	// the tick at 3s fences.
	e.clk.Advance(time.Second)
	if m := n.nextAny(t); m.GetHeartbeat() == nil {
		t.Fatalf("got %v, want Heartbeat", m)
	}
	e.clk.Advance(time.Second)
	if err := n.waitClosed(t); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("connection ended with %v, want DeadlineExceeded", err)
	}
	snap := e.waitUntil(t, "fenced", func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	if p, ok := providerOf(snap, "n1", "p1"); ok {
		t.Fatalf("provider %+v, want the fenced, drained provider gone", p)
	}
}

func TestHelloTimeout(t *testing.T) {
	e := startEdge(t, testConfig())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := e.client.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.clk.waitArmed(t, 3*testHeartbeat, 1)
	e.clk.Advance(3 * testHeartbeat)
	if _, err := stream.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Recv = %v, want DeadlineExceeded", err)
	}
}

func TestProviderHealth(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{ProviderId: "p1", Healthy: false}}})
	e.waitUntil(t, "unhealthy", func(s contract.Snapshot) bool { p, _ := providerOf(s, "n1", "p1"); return !p.Healthy })
	if _, err := e.svc.Dispatch(context.Background(), chatReq("m1")); !errors.Is(err, scheduler.ErrNoProvider) {
		t.Fatalf("Dispatch to an unhealthy provider = %v, want ErrNoProvider", err)
	}
	n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{ProviderId: "p1", Healthy: true, LongCapacity: 1}}})
	snap := e.waitUntil(t, "healthy", func(s contract.Snapshot) bool { p, _ := providerOf(s, "n1", "p1"); return p.Healthy })
	p, _ := providerOf(snap, "n1", "p1")
	if p.Type != "sim" || p.Path != contract.PathNormalized || !equal(p.Models, []string{"m1"}) || !equal(p.Capabilities, []string{"cancel", "stream"}) || p.Status != "available" {
		t.Errorf("provider snapshot %+v", p)
	}
	e.startRun(t, n, chatReq("m1"))
}

func TestShutdownEndsRuns(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	run, _, _ := e.startRun(t, n, chatReq("m1"))
	if err := e.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := run.Recv(); !errors.Is(err, ErrNodeGone) {
		t.Fatalf("Recv = %v, want ErrNodeGone", err)
	}
	if n.waitClosed(t) == nil {
		t.Fatal("control stream ended cleanly, want an error")
	}
	if snap := e.svc.Snapshot(); snap.Leases != 0 {
		t.Fatalf("%d leases after shutdown", snap.Leases)
	}
}

// Regression (breaker report): long_capacity was never enforced because no
// request was ever classified long-context. A request whose estimated prompt
// reaches long_context_tokens needs a free long slot.
func TestRegression_LongContextRequestsRespectLongCapacity(t *testing.T) {
	cfg := testConfig()
	cfg.LongContextTokens = 1000
	e := startEdge(t, cfg)
	p := prov("p1", normalized, 2, "m1")
	p.LongCapacity = 1
	n := e.connect(t, hello("n1", p))
	long := chatReq("m1")
	long.EstimatedInputTokens = 1000
	e.startRun(t, n, long)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := e.dispatchAsync(ctx, long)
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	// A short request still gets the provider's second slot.
	e.startRun(t, n, chatReq("m1"))
	cancel()
	if r := wait(t, res); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("queued long request: %v", r.err)
	}
}

// TestRegression_BusyRefusalIsNoProviderFailure: a node on several edges
// refuses a Dispatch whose provider already runs its capacity there
// (DispatchRefused.busy, the other edges' runs). Counted as a provider
// failure, such refusals on three edges without a cluster opened healthy
// providers' circuits: 35 of 40 requests got 503 provider_unavailable, the
// others 502. A busy refusal is ErrProviderBusy
// (503 provider_busy with Retry-After at the API) and leaves the circuit
// closed, however many come.
func TestRegression_BusyRefusalIsNoProviderFailure(t *testing.T) {
	cfg := testConfig()
	zero := 0
	cfg.MaxRetries = &zero
	e := startEdge(t, cfg)
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "m1")))
	for i := range 5 { // above the breaker's 3 failures in a row
		res := e.dispatchAsync(context.Background(), chatReq("m1"))
		d := n.nextDispatch(t)
		n.send(t, &nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: d.GetRunId(), Reason: "provider at capacity on this node", Busy: true}}})
		r := wait(t, res)
		if !errors.Is(r.err, ErrProviderBusy) || !errors.Is(r.err, ErrDispatchRefused) {
			t.Fatalf("refusal %d: Dispatch = %v, want ErrProviderBusy", i, r.err)
		}
	}
	p, ok := providerOf(e.svc.Snapshot(), "n1", "p1")
	if !ok || p.Circuit != "closed" || p.Status != "available" || p.InFlight != 0 {
		t.Fatalf("provider after 5 busy refusals: %+v, want available, circuit closed, nothing in flight", p)
	}
	e.startRun(t, n, chatReq("m1"))
}
