package adapter

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"iop/internal/wire/nodev1"
)

// eventWireSink is an EventSink that marshals each batch of events as the
// node's eventSink sends it up (one RunUp) and gRPC marshals it.
type eventWireSink struct {
	buf  []byte
	msgs int
}

func (s *eventWireSink) Send(events ...*nodev1.RunEvent) error {
	var err error
	s.buf, err = proto.MarshalOptions{}.MarshalAppend(s.buf[:0], &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: events}}})
	s.msgs++
	return err
}

// streamed20 are a 20-token streamed answer as an OpenAI-compatible server
// (SSE) and as Ollama (NDJSON) write it.
func streamed20() (sse, ndjson string) {
	var s, n strings.Builder
	for i := range 20 {
		fmt.Fprintf(&s, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1764547200,\"model\":\"served\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}]}\n\n", i)
		fmt.Fprintf(&n, "{\"model\":\"served\",\"created_at\":\"2026-01-01T00:00:00.000000Z\",\"message\":{\"role\":\"assistant\",\"content\":\"tok%d \"},\"done\":false}\n", i)
	}
	s.WriteString("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1764547200,\"model\":\"served\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":20,\"total_tokens\":32}}\n\ndata: [DONE]\n\n")
	n.WriteString("{\"model\":\"served\",\"created_at\":\"2026-01-01T00:00:00.000000Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done_reason\":\"length\",\"done\":true,\"total_duration\":1000,\"load_duration\":10,\"prompt_eval_count\":12,\"prompt_eval_duration\":100,\"eval_count\":20,\"eval_duration\":800}\n")
	return s.String(), n.String()
}

// BenchmarkNodePaths measures what the node spends on one request on each
// execution path, per request, against a loopback server answering 20
// tokens streamed: tunnel (an OpenAI-compatible server's SSE relayed,
// wireSink) and normalized (Ollama's NDJSON turned into run events,
// eventWireSink), for a small request and for an agent's 95 KiB one.
// cpu-ns/op is the process's CPU time (the server's too, the same on both
// paths but for the format) per request.
func BenchmarkNodePaths(b *testing.B) {
	sse, ndjson := streamed20()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.URL.Path, "/api/") {
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, ndjson)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, sse)
	}))
	defer srv.Close()
	o, err := NewOpenAI(Config{BaseURL: srv.URL + "/v1", MaxConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	ol, err := NewOllama(Config{BaseURL: srv.URL, MaxConns: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer ol.Close()
	for _, size := range []struct {
		name string
		body []byte
	}{
		{"small", []byte(`{"model":"alias","stream":true,"messages":[{"role":"user","content":"hi"}]}`)},
		{"agent_95KiB", agentBody(b, "alias")},
	} {
		req := Request{Op: nodev1.Operation_OPERATION_CHAT, Stream: true, ServedModel: "served", Body: size.body}
		b.Run("tunnel/"+size.name, func(b *testing.B) {
			sink := &wireSink{}
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				sink.reset()
				if err := o.Tunnel(context.Background(), req, sink); err != nil {
					b.Fatal(err)
				}
				sink.finish()
			}
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
		b.Run("normalized/"+size.name, func(b *testing.B) {
			sink := &eventWireSink{}
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				if err := ol.Normalize(context.Background(), req, sink); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
