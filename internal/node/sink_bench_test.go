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

// unmarshalStream is a run stream whose Recv does what gRPC's does with
// each of msgs in turn: unmarshal it from its wire bytes (the codec), into
// a new message.
type unmarshalStream struct {
	grpc.BidiStreamingClient[nodev1.RunUp, nodev1.RunDown]
	wire [][]byte
	next int
}

func (s *unmarshalStream) Recv() (*nodev1.RunDown, error) {
	m := new(nodev1.RunDown)
	err := proto.Unmarshal(s.wire[s.next%len(s.wire)], m)
	s.next++
	return m, err
}

// BenchmarkRunBody measures a run's request body of 95 KiB received from
// the edge in Body messages of at most chunk bytes (64 KiB, as the edge
// sent a body too large to go inline before; 1 MiB, as it sends it now:
// one message), the codec's unmarshal included, until the node holds it
// whole (readRunDown).
func BenchmarkRunBody(b *testing.B) {
	body := make([]byte, 95<<10)
	for _, bc := range []struct {
		name  string
		chunk int
	}{{"chunks_64KiB", 64 << 10}, {"chunks_1MiB", 1 << 20}} {
		var wire [][]byte
		for rest := body; ; {
			n := min(len(rest), bc.chunk)
			w, err := proto.Marshal(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: rest[:n], Last: n == len(rest)}}})
			if err != nil {
				b.Fatal(err)
			}
			wire = append(wire, w)
			if rest = rest[n:]; len(rest) == 0 {
				break
			}
		}
		// After the body, the next run's Dispatch ends readRunDown (a warm
		// stream's).
		w, _ := proto.Marshal(&nodev1.RunDown{Msg: &nodev1.RunDown_Dispatch{Dispatch: &nodev1.Dispatch{RunId: "next"}}})
		wire = append(wire, w)
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			bodies := make(chan bodyResult, 1)
			for b.Loop() {
				s := &unmarshalStream{wire: wire}
				if readRunDown(s, nil, false, bodies) == nil {
					b.Fatal("no dispatch after the body")
				}
				if got := <-bodies; len(got.data) != len(body) {
					b.Fatalf("body of %d bytes, want %d", len(got.data), len(body))
				}
			}
		})
	}
}

// TestRunBodyChunksJoined: a body in several Body messages is delivered
// whole and in order; one in a single message is delivered as it came.
func TestRunBodyChunksJoined(t *testing.T) {
	t.Parallel()
	for _, chunks := range [][]string{{"{\"a\":", "1", "}"}, {`{"a":1}`}, {""}} {
		var wire [][]byte
		want := ""
		for i, c := range chunks {
			want += c
			w, err := proto.Marshal(&nodev1.RunDown{Msg: &nodev1.RunDown_Body{Body: &nodev1.Body{Data: []byte(c), Last: i == len(chunks)-1}}})
			if err != nil {
				t.Fatal(err)
			}
			wire = append(wire, w)
		}
		w, _ := proto.Marshal(&nodev1.RunDown{Msg: &nodev1.RunDown_Dispatch{Dispatch: &nodev1.Dispatch{RunId: "next"}}})
		bodies := make(chan bodyResult, 1)
		if readRunDown(&unmarshalStream{wire: append(wire, w)}, nil, false, bodies) == nil {
			t.Fatal("no dispatch after the body")
		}
		if got := <-bodies; got.err != nil || string(got.data) != want {
			t.Fatalf("chunks %q: body %q (%v), want %q", chunks, got.data, got.err, want)
		}
	}
}
