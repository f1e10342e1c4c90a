package node

import (
	"net/http"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"iop/internal/node/adapter"
	"iop/internal/wire/nodev1"
)

// marshalStream is a run stream whose Send does what gRPC's does with the
// message before it returns: marshal it (the codec), into a reused buffer.
type marshalStream struct {
	grpc.BidiStreamingClient[nodev1.RunUp, nodev1.RunDown]
	buf []byte
}

func (s *marshalStream) Send(m *nodev1.RunUp) error {
	var err error
	s.buf, err = proto.MarshalOptions{}.MarshalAppend(s.buf[:0], m)
	return err
}

// BenchmarkTunnelSinkData measures one relayed chunk of a tunnel answer
// (an SSE event of one token, 160 bytes) through the node's tunnelSink, the
// codec's marshal included; BenchmarkEventSinkSend one delta event through
// the eventSink.
func BenchmarkTunnelSinkData(b *testing.B) {
	s := &tunnelSink{s: &marshalStream{}}
	chunk := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764547200,"model":"served","choices":[{"index":0,"delta":{"content":"one "}}]}` + "\n\n")
	if err := s.Head(adapter.TunnelHead{Status: http.StatusOK, Header: http.Header{"Content-Type": {"text/event-stream"}}}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Data(chunk); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEventSinkSend(b *testing.B) {
	s := &eventSink{s: &marshalStream{}}
	ev := &nodev1.RunEvent{Type: nodev1.RunEvent_TYPE_DELTA, Text: "one "}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Send(ev); err != nil {
			b.Fatal(err)
		}
	}
}
