package edge

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// frames joins protobuf messages into one fuzz input: each is a length
// byte and that many bytes (so each message is at most 255 bytes).
func frames(t testing.TB, msgs ...proto.Message) []byte {
	var out []byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil || len(b) > 255 {
			t.Fatalf("seed message %v: %d bytes, %v", m, len(b), err)
		}
		out = append(append(out, byte(len(b))), b...)
	}
	return out
}

// unframe splits a fuzz input made by frames (a short last frame is
// taken as it is).
func unframe(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		n := min(int(b[0]), len(b)-1)
		out = append(out, b[1:1+n])
		b = b[1+n:]
	}
	return out
}

// FuzzClassifyRunUp: any RunUp a node can send is classified without a
// panic, and a message that ends the run is one meant for the run.
func FuzzClassifyRunUp(f *testing.F) {
	for _, m := range []*nodev1.RunUp{
		events(event(nodev1.RunEvent_TYPE_DELTA, "x"), event(nodev1.RunEvent_TYPE_COMPLETE, "")),
		events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_ERROR, Status: 502, Error: "e"}),
		{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{ProviderError: "x"}}},
		{Msg: &nodev1.RunUp_TunnelError{TunnelError: &nodev1.TunnelError{Status: 504}}},
		{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{RunId: "r", NodeId: "n", Generation: 3}}},
		{},
	} {
		b, _ := proto.Marshal(m)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m nodev1.RunUp
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		reason, terminal, ok := classifyRunUp(&m)
		if terminal && (!ok || reason == "") {
			t.Fatalf("%v: terminal %v, ok %v, reason %q", &m, terminal, ok, reason)
		}
	})
}

// FuzzNodeProtocol drives a real edge over gRPC as a misbehaving node: after
// a valid hello and a dispatched run, the node sends arbitrary control
// messages (NodeMessage) and arbitrary run messages (RunUp), then goes
// away. Whatever it sent, the edge must not panic, the run's Recv must end,
// and no lease may stay held.
func FuzzNodeProtocol(f *testing.F) {
	control := frames(f,
		&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Heartbeat{Heartbeat: &nodev1.Heartbeat{}}},
		&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{ProviderId: "p1", Capacity: 0, Healthy: false}}},
		&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_ProviderUpdate{ProviderUpdate: &nodev1.ProviderUpdate{ProviderId: "nope", Capacity: -5, LongCapacity: 9}}},
		&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_DispatchRefused{DispatchRefused: &nodev1.DispatchRefused{RunId: "run_x", Reason: "r"}}},
		&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: hello("n1", prov("p1", normalized, 1, "m-small"))}},
	)
	normalizedUp := frames(f,
		events(event(nodev1.RunEvent_TYPE_STARTED, "")),
		events(event(nodev1.RunEvent_TYPE_DELTA, "hel"), event(nodev1.RunEvent_TYPE_DELTA, "lo")),
		events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: -1, CompletionTokens: 1 << 30}),
		events(&nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}),
		events(event(nodev1.RunEvent_TYPE_DELTA, "after the end")),
	)
	tunnelUp := frames(f,
		&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte("data before the head")}}},
		&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 99, Headers: map[string]string{"Content-Type": "text/event-stream", "": "x"}}}},
		&nodev1.RunUp{Msg: &nodev1.RunUp_Open{Open: &nodev1.RunOpen{RunId: "again", NodeId: "n1", Generation: 1}}},
		&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}},
	)
	f.Add(false, []byte(nil), normalizedUp)
	f.Add(false, control, normalizedUp)
	f.Add(true, []byte(nil), tunnelUp)
	f.Add(true, control[:len(control)/2], tunnelUp)
	f.Add(false, []byte{3, 0xff, 0xff, 0xff}, []byte{200, 1, 2, 3})
	f.Fuzz(func(t *testing.T, tunnelPath bool, control, up []byte) {
		e := startEdge(t, testConfig())
		path := normalized
		if tunnelPath {
			path = tunnel
		}
		n := e.connect(t, hello("n1", prov("p1", path, 1, "m-small")))
		run, rs, _ := e.startRun(t, n, chatReq("m-small"))
		recvDone := make(chan error, 1)
		go func() {
			_, err := recvAll(run)
			recvDone <- err
		}()
		for _, b := range unframe(control) {
			var m nodev1.NodeMessage
			if proto.Unmarshal(b, &m) == nil {
				_ = n.stream.Send(&m) // the edge may have ended the stream
			}
		}
		for _, b := range unframe(up) {
			var m nodev1.RunUp
			if proto.Unmarshal(b, &m) == nil {
				_ = rs.Send(&m)
			}
		}
		_ = rs.CloseSend()
		n.cancel() // the node goes away: its generation is fenced
		select {
		case <-recvDone:
		case <-time.After(failsafe):
			t.Fatal("the run's Recv never ended")
		}
		run.Close("fuzz input done")
		e.waitUntil(t, "every lease released", func(s contract.Snapshot) bool { return s.Leases == 0 && s.Waiters == 0 })
	})
}
