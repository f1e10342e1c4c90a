package edge

import (
	"context"
	"io"
	"reflect"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// TestEachRunMessageIsDecodedOnce: every message a node sends up a run is
// decoded (classified) once on its way to the caller of Recv, also the
// ones Dispatch read ahead to decide on a retry (a failed provider's, and
// the answering provider's first), which Recv hands on without decoding
// them again; the caller gets the typed messages in order.
func TestEachRunMessageIsDecodedOnce(t *testing.T) {
	for _, tc := range []struct {
		name       string
		path       nodev1.ExecutionPath
		bad, good  []*nodev1.RunUp
		wantKinds  []contract.EventKind // the first event of each message the caller gets
		wantEvents int
	}{
		{"normalized", normalized,
			[]*nodev1.RunUp{errorEvent(503)},
			[]*nodev1.RunUp{events(event(nodev1.RunEvent_TYPE_STARTED, "")), events(event(nodev1.RunEvent_TYPE_DELTA, "hi"), event(nodev1.RunEvent_TYPE_DELTA, "")),
				events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: 2, CompletionTokens: 1}, &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"})},
			// STARTED is the edge's alone and an empty delta carries nothing: neither reaches the caller.
			[]contract.EventKind{0, contract.EventDelta, contract.EventUsage}, 3},
		{"tunnel", tunnel,
			[]*nodev1.RunUp{tunnelHead(503), tunnelData(`{"error":"busy"}`), tunnelEnd()},
			[]*nodev1.RunUp{tunnelHead(200), tunnelData(`{"ok":true}`), tunnelEnd()},
			[]contract.EventKind{contract.EventHead, contract.EventData, contract.EventEnd}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := startEdge(t, retryConfig(1))
			bad := e.connect(t, hello("a-bad", prov("a", tc.path, 1, "m1")))
			good := e.connect(t, hello("z-good", prov("z", tc.path, 1, "m1")))
			before := decodes.Load()
			res := e.dispatchAsync(context.Background(), chatReq("m1"))
			_, rs := acceptRun(t, bad) // ties go to provider "a"
			for _, m := range tc.bad {
				sendUp(t, rs, m)
			}
			_, rs2 := acceptRun(t, good)
			for _, m := range tc.good {
				sendUp(t, rs2, m)
			}
			r := wait(t, res)
			if r.err != nil {
				t.Fatalf("Dispatch = %v", r.err)
			}
			defer r.run.Close(contract.OutcomeCompleted)
			got, err := recvAll(r.run)
			if err != io.EOF || len(got) != len(tc.wantKinds) || !got[len(got)-1].Ends {
				t.Fatalf("Recv gave %+v then %v; want %d messages, the last ending the run, then EOF", got, err, len(tc.wantKinds))
			}
			n := 0
			for i, m := range got {
				n += len(m.Events)
				if m.Tunnel {
					n++ // its Part
				}
				if first(m).Kind != tc.wantKinds[i] || m.Tunnel != (tc.path == tunnel) {
					t.Errorf("message %d = %+v, want first event kind %d", i, m, tc.wantKinds[i])
				}
			}
			if n != tc.wantEvents {
				t.Errorf("%d events reached the caller, want %d", n, tc.wantEvents)
			}
			if d, sent := decodes.Load()-before, len(tc.bad)+len(tc.good); d != int64(sent) {
				t.Errorf("%d messages decoded, want %d: each of the %d sent once", d, sent, sent)
			}
		})
	}
}

// TestDecodeRunUp: a node's messages as the contract's typed events: the
// fields the HTTP API renders, a run's end (Ends), and what it does not
// hand on.
func TestDecodeRunUp(t *testing.T) {
	if _, ok := DecodeRunUp(&nodev1.RunUp{}); ok {
		t.Error("an empty message was handed on")
	}
	if _, ok := DecodeRunUp(&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{RunId: "r"}}}); ok {
		t.Error("a repeated RunOpen was handed on")
	}
	delta := events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: "t", Thinking: "th",
		ToolCalls:  []*nodev1.ToolCallDelta{{Index: 1, Id: "call_1", Name: "f", Arguments: `{"a"`}},
		Embeddings: []*nodev1.Embedding{{Values: []float32{0.5, 1}}}})
	m, ok := DecodeRunUp(delta)
	want := contract.Event{Kind: contract.EventDelta, Text: "t", Thinking: "th",
		ToolCalls:  []contract.ToolCallPart{{Index: 1, ID: "call_1", Name: "f", Arguments: `{"a"`}},
		Embeddings: [][]float32{{0.5, 1}}}
	if !ok || m.Tunnel || m.Ends || len(m.Events) != 1 || !equalEvent(m.Events[0], want) {
		t.Errorf("delta = %+v", m)
	}
	for _, tc := range []struct {
		name string
		in   *nodev1.RunUp
		want contract.Event
	}{
		{"complete", events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "length"}), contract.Event{Kind: contract.EventEnd, FinishReason: "length"}},
		{"error", events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: "e", Status: 504}), contract.Event{Kind: contract.EventFailure, Status: 504, Message: "e"}},
		{"invalid request", events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Error: "tools: bad", Status: 400, InvalidRequest: true, Param: "tools"}),
			contract.Event{Kind: contract.EventFailure, Status: 400, Message: "tools: bad", InvalidRequest: true, Param: "tools"}},
		{"cancelled", events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_CANCELLED}), contract.Event{Kind: contract.EventFailure, Cancelled: true}},
		{"tunnel end", &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{ProviderError: "boom"}}}, contract.Event{Kind: contract.EventEnd, ProviderError: "boom"}},
		{"tunnel error", tunnelError(502), contract.Event{Kind: contract.EventFailure, Status: 502, Message: "provider unreachable: connection refused"}},
		// The node's own refusal of a request it could not send.
		{"tunnel 400", &nodev1.RunUp{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Message: "m", Status: 400}}},
			contract.Event{Kind: contract.EventFailure, Status: 400, Message: "m", InvalidRequest: true}},
	} {
		m, ok := DecodeRunUp(tc.in)
		if !ok || !m.Ends || !equalEvent(first(m), tc.want) || m.Tunnel == (len(m.Events) == 1) {
			t.Errorf("%s = %+v, want one event %+v ending the run", tc.name, m, tc.want)
		}
	}
	if m, ok := DecodeRunUp(tunnelHead(200)); !ok || !m.Tunnel || m.Ends || first(m).Kind != contract.EventHead || first(m).Status != 200 ||
		first(m).Headers["Content-Type"] != "application/json" {
		t.Errorf("head = %+v", m)
	}
}

func equalEvent(a, b contract.Event) bool { return reflect.DeepEqual(a, b) }
