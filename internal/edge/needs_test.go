package edge

import (
	"context"
	"errors"
	"strings"
	"testing"

	"iop/internal/scheduler"
	"iop/internal/wire/nodev1"
)

// "x" and "x:latest" are one model (Ollama's naming rule), so they share
// one queue: with a capacity-1 provider serving "x:latest", a request for
// "x" holds the slot, one for "x:latest" waits behind it in the same group
// (one queue in the Snapshot, none named "x") and is admitted when the
// first ends.
func TestLatestTagSharesOneQueue(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", normalized, 1, "x:latest")))
	first, rs, d := e.startRun(t, n, chatReq("x"))
	if d.GetServedModel() != "x:latest" {
		t.Fatalf("dispatched %v, want the served name x:latest", d)
	}

	second := e.dispatchAsync(context.Background(), chatReq("x:latest"))
	e.clk.waitArmed(t, testQueueTimeout, 1) // the second request is queued
	// The queues are the alias's (chat) and x:latest's: none named "x".
	snap := e.svc.Snapshot()
	if len(snap.Queues) != 2 || queueOf(snap, "x:latest").Queued != 1 || queueOf(snap, "chat").Model != "chat" {
		t.Fatalf("queues %+v, want chat's and the one group x:latest holding the waiter", snap.Queues)
	}
	// A third spelling-alike request queues in the same group, behind it.
	third := e.dispatchAsync(context.Background(), chatReq("x"))
	e.clk.waitArmed(t, testQueueTimeout, 2)
	snap = e.svc.Snapshot()
	if len(snap.Queues) != 2 || queueOf(snap, "x:latest").Queued != 2 {
		t.Fatalf("queues %+v, want one group x:latest with 2 queued", snap.Queues)
	}

	// The first run ends: its slot goes to the earliest waiter, the
	// "x:latest" request.
	sendUp(t, rs, events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}))
	if _, err := recvAll(first); err == nil {
		t.Fatal("run did not end")
	}
	run2, _, d2 := n.acceptRun(t, second)
	if d2.GetServedModel() != "x:latest" || run2.Info().RunID != d2.GetRunId() {
		t.Fatalf("the slot went to %v, want the x:latest request", d2)
	}
	if snap := e.svc.Snapshot(); snap.Waiters != 1 || e.inFlight("n1", "p1") != 1 {
		t.Fatalf("after hand-over: %d waiters, in flight %d; want 1 and 1", snap.Waiters, e.inFlight("n1", "p1"))
	}
	// Its end hands the slot to the third request, in the same group. The
	// run's Cancel and the third request's Dispatch go down the control
	// stream in either order: the release that frees the slot comes first.
	run2.Close("test done")
	var d3 *nodev1.Dispatch
	for range 2 {
		m := n.next(t)
		switch {
		case m.GetCancel() != nil && m.GetCancel().GetRunId() == d2.GetRunId():
		case m.GetDispatch() != nil && d3 == nil:
			d3 = m.GetDispatch()
		default:
			t.Fatalf("got %v, want the Cancel of %q and one Dispatch", m, d2.GetRunId())
		}
	}
	rs3 := n.openRun(t, d3.GetRunId(), n.gen)
	e.readBody(t, d3, rs3)
	r3 := wait(t, third)
	if r3.err != nil {
		t.Fatalf("third request: %v", r3.err)
	}
	defer r3.run.Close("test done")
	if snap := e.svc.Snapshot(); snap.Waiters != 0 || e.inFlight("n1", "p1") != 1 {
		t.Fatalf("at the end: %d waiters, in flight %d; want 0 and 1", snap.Waiters, e.inFlight("n1", "p1"))
	}
}

// A request for several choices (NeedChoices, OpenAI's n above 1) goes
// only to tunnel-path providers: an alias mixing both paths sends it to
// the tunnel one even when the normalized one would win the tie, and a
// model served by normalized providers alone rejects it at once, naming n,
// with nothing reserved.
func TestNeedChoicesOnlyTunnelProviders(t *testing.T) {
	cfg := testConfig()
	cfg.Models["mixed"] = ModelConfig{Targets: []string{"m-ollama", "m-vllm"}}
	e := startEdge(t, cfg)
	// "a-ollama" sorts first: ties go to it.
	n := e.connect(t, hello("n1", prov("a-ollama", normalized, 4, "m-ollama"), prov("b-vllm", tunnel, 4, "m-vllm")))

	if _, _, d := e.startRun(t, n, chatReq("mixed")); d.GetProviderId() != "a-ollama" {
		t.Fatalf("one choice went to %q, want the tie-break winner a-ollama", d.GetProviderId())
	}
	for range 3 {
		req := chatReq("mixed")
		req.Needs = []string{NeedChoices}
		if _, _, d := e.startRun(t, n, req); d.GetProviderId() != "b-vllm" || d.GetServedModel() != "m-vllm" {
			t.Fatalf("several choices went to %s/%s, want b-vllm/m-vllm", d.GetProviderId(), d.GetServedModel())
		}
	}

	req := chatReq("m-ollama")
	req.Needs = []string{"stream", NeedChoices}
	_, err := e.svc.Dispatch(context.Background(), req)
	if !errors.Is(err, scheduler.ErrCandidatesRejected) || !strings.Contains(err.Error(), "n above 1") {
		t.Fatalf("Dispatch = %v, want ErrCandidatesRejected naming n", err)
	}
	if snap := e.svc.Snapshot(); snap.Waiters != 0 || snap.Leases != 4 {
		t.Fatalf("%d waiters, %d leases after the rejection; want 0 and the 4 runs above", snap.Waiters, snap.Leases)
	}
}

// The other needs only tunnel-path providers meet: tool_choice "required"
// or parallel_tool_calls false (NeedToolChoice), an image by URL
// (NeedRemoteImages), several completions prompts (NeedPromptBatch) and
// token ids as input (NeedTokenInput). A mixed alias sends such a request to the tunnel
// provider; a model served by normalized providers alone rejects it at
// once, saying why, with nothing reserved.
func TestTunnelOnlyNeeds(t *testing.T) {
	for need, why := range map[string]string{
		NeedToolChoice:   `honours parallel_tool_calls false`,
		NeedRemoteImages: "send the image inline as a base64 data URL",
		NeedPromptBatch:  "send one request per prompt",
		NeedTokenInput:   "takes token ids as input",
	} {
		t.Run(need, func(t *testing.T) {
			cfg := testConfig()
			cfg.Models["mixed"] = ModelConfig{Targets: []string{"m-ollama", "m-vllm"}}
			e := startEdge(t, cfg)
			n := e.connect(t, hello("n1", prov("a-ollama", normalized, 4, "m-ollama"), prov("b-vllm", tunnel, 4, "m-vllm")))
			req := chatReq("mixed")
			req.Needs = []string{need}
			if _, _, d := e.startRun(t, n, req); d.GetProviderId() != "b-vllm" {
				t.Fatalf("went to %q, want the tunnel provider b-vllm", d.GetProviderId())
			}
			req = chatReq("m-ollama")
			req.Needs = []string{need}
			_, err := e.svc.Dispatch(context.Background(), req)
			if !errors.Is(err, scheduler.ErrCandidatesRejected) || !strings.Contains(err.Error(), why) {
				t.Fatalf("Dispatch = %v, want ErrCandidatesRejected saying %q", err, why)
			}
			if snap := e.svc.Snapshot(); snap.Waiters != 0 || snap.Leases != 1 {
				t.Fatalf("%d waiters, %d leases after the rejection; want 0 and 1", snap.Waiters, snap.Leases)
			}
		})
	}
}
