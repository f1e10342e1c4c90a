package openai

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/internal/edge/api/apitest"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// flushRecorder records the body and, for each flush, how much of it had
// been written by then.
type flushRecorder struct {
	*httptest.ResponseRecorder
	flushedAt []int
}

func (w *flushRecorder) Flush() {
	w.flushedAt = append(w.flushedAt, w.Body.Len())
	w.ResponseRecorder.Flush()
}

// chatRequest is a POST /v1/chat/completions of body.
func chatRequest(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, chatPath, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	return r
}

// TestStreamFlushesOncePerMessage: the events of one run-event message
// reach the client with one flush, and every message's events are flushed
// before the next message is read (none waits for a later one).
func TestStreamFlushesOncePerMessage(t *testing.T) {
	t.Parallel()
	run := apitest.ScriptedRun(contract.PathNormalized,
		apitest.Events(apitest.Delta("a"), apitest.Delta("b"), apitest.Delta("c")),
		apitest.Events(apitest.Delta("d")),
		apitest.Events(apitest.Usage(1, 4), apitest.Complete("stop")))
	gw := &apitest.Gateway{Names: []string{"m"}, DispatchFunc: apitest.RunWith(run)}
	w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	newHandler(gw).ServeHTTP(w, chatRequest(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	body := w.Body.String()
	if w.Code != http.StatusOK {
		t.Fatalf("status %d:\n%s", w.Code, body)
	}
	// The body at each flush: after the first message (role chunk and
	// a, b, c), after d, and at the end (finish chunk and [DONE]).
	if len(w.flushedAt) != 3 {
		t.Fatalf("%d flushes at %v, want 3:\n%s", len(w.flushedAt), w.flushedAt, body)
	}
	first, second := body[:w.flushedAt[0]], body[w.flushedAt[0]:w.flushedAt[1]]
	if strings.Count(first, "data: ") != 4 || !strings.Contains(first, `"content":"c"`) {
		t.Fatalf("first flush:\n%s", first)
	}
	if strings.Count(second, "data: ") != 1 || !strings.Contains(second, `"content":"d"`) {
		t.Fatalf("second flush:\n%s", second)
	}
	if w.flushedAt[2] != len(body) || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("the end is not flushed:\n%s", body)
	}
}

// discardWriter is an http.ResponseWriter and http.Flusher that drops the
// body: the benchmark measures the edge's own work per chunk, not a
// socket.
type discardWriter struct {
	header http.Header
	n      int64
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}
func (w *discardWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// The deadlines a connection's writer takes (http.ResponseController), so
// that the frame's per-write deadline costs what it does on a socket.
func (w *discardWriter) SetReadDeadline(time.Time) error  { return nil }
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }
func (w *discardWriter) EnableFullDuplex() error          { return nil }

// BenchmarkRenderChunk measures the edge's render of one delta run event
// into an OpenAI chat.completion.chunk SSE event on the normalized path
// (chatRender.stream), write and flush included: one request whose run
// sends b.N deltas. One op is one chunk.
func BenchmarkRenderChunk(b *testing.B) {
	delta := &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: []*nodev1.RunEvent{
		{Type: nodev1.RunEvent_TYPE_DELTA, Text: " token"}}}}}
	complete := &nodev1.RunUp{Msg: &nodev1.RunUp_Events{Events: &nodev1.RunEvents{Events: []*nodev1.RunEvent{
		{Type: nodev1.RunEvent_TYPE_USAGE, PromptTokens: 10, CompletionTokens: int32(b.N)},
		{Type: nodev1.RunEvent_TYPE_COMPLETE, FinishReason: "stop"}}}}}
	run := &generatedRun{path: contract.PathNormalized, body: decoded(delta), last: decoded(complete), n: b.N - 1}
	gw := &apitest.Gateway{Names: []string{"bench-ollama"},
		DispatchFunc: func(context.Context, contract.Request) (Run, error) { return run, nil }}
	h := newHandler(gw)
	w := &discardWriter{header: http.Header{}}
	r := chatRequest(`{"model":"bench-ollama","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`)
	b.ReportAllocs()
	b.ResetTimer()
	h.ServeHTTP(w, r)
	b.StopTimer()
	if w.n == 0 {
		b.Fatal("nothing rendered")
	}
}
