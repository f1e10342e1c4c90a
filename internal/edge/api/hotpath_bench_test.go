package api

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// chatBody returns a chat completion request body with the given number of
// messages of contentChars bytes each, and tools if withTools.
func chatBody(messages, contentChars int, withTools bool) []byte {
	var b strings.Builder
	b.WriteString(`{"model":"bench-openai","stream":true,"stream_options":{"include_usage":true},"max_tokens":256,"temperature":0.7,"messages":[`)
	content := strings.Repeat("x", contentChars)
	for i := range messages {
		if i > 0 {
			b.WriteByte(',')
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `{"role":%q,"content":%q}`, role, content)
	}
	b.WriteString(`]`)
	if withTools {
		b.WriteString(`,"tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`)
	}
	b.WriteString(`}`)
	return []byte(b.String())
}

// BenchmarkDecodeChatRequest measures the edge's parse and check of a chat
// completion body (request.DecodeChat), per request.
func BenchmarkDecodeChatRequest(b *testing.B) {
	agent, err := os.ReadFile("../testdata/agent_100k.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"small_1msg_64B", chatBody(1, 64, false)},
		{"chat_10msgs_1KiB_tools", chatBody(10, 1024, true)},
		{"long_50msgs_4KiB", chatBody(50, 4096, false)},
		{"agent_95KiB", agent},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := request.DecodeChat(bc.body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// discardWriter is an http.ResponseWriter and http.Flusher that drops the
// body: the benchmarks below measure the edge's own work per chunk, not a
// socket.
type discardWriter struct {
	header http.Header
	n      int64
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}
func (w *discardWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// generatedRun is a Run that yields first, then body n times, then last,
// then io.EOF, without buffering them all.
type generatedRun struct {
	path        contract.Path
	first, last *contract.Message // decoded once, as the edge does on arrival
	body        *contract.Message
	n, i        int
}

func (r *generatedRun) Info() contract.DispatchInfo {
	return contract.DispatchInfo{RunID: "run_0123456789abcdef", NodeID: "n", ProviderID: "p", Path: r.path}
}
func (r *generatedRun) Close(contract.Outcome) {}
func (r *generatedRun) Cancel(string)          {}
func (r *generatedRun) Fail(string)            {}
func (r *generatedRun) Recv() (contract.Message, error) {
	r.i++
	switch {
	case r.i == 1 && r.first != nil:
		return *r.first, nil
	case r.i <= r.n+1:
		return *r.body, nil
	case r.i == r.n+2:
		return *r.last, nil
	default:
		return contract.Message{}, io.EOF
	}
}

func benchResponse(run Run) (*Answer, *discardWriter) {
	h := &handler{cfg: Config{}.withDefaults(), logger: slog.New(slog.DiscardHandler)}
	w := &discardWriter{header: http.Header{}}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	return &Answer{h: h, w: w, r: r, run: run, req: &contract.Request{Model: "bench-openai"}, writeError: h.writeError}, w
}

// sseChunk is a typical chat.completion.chunk event of one token, as vLLM
// or iop sim sends it.
const sseChunk = `data: {"id":"chatcmpl-sim-1","object":"chat.completion.chunk","created":1767225600,"model":"bench-openai","system_fingerprint":"fp_sim","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n"

// BenchmarkTunnelRelayChunk measures the edge's relay of one TunnelData
// frame (one SSE event) to the client on the tunnel path: type switch,
// write, flush. One op is one chunk.
func BenchmarkTunnelRelayChunk(b *testing.B) {
	run := &generatedRun{
		path:  contract.PathTunnel,
		first: decoded(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{Status: 200, Headers: map[string]string{"Content-Type": "text/event-stream"}}}}),
		body:  decoded(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte(sseChunk)}}}),
		last:  decoded(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}}),
		n:     b.N,
	}
	rr, w := benchResponse(run)
	b.ReportAllocs()
	b.SetBytes(int64(len(sseChunk)))
	b.ResetTimer()
	if reason := rr.tunnel(); reason != ReasonCompleted {
		b.Fatalf("tunnel ended %q", reason)
	}
	b.StopTimer()
	if w.n < int64(b.N*len(sseChunk)) {
		b.Fatalf("relayed %d bytes, want at least %d", w.n, b.N*len(sseChunk))
	}
}
