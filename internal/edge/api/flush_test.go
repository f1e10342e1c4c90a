package api

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/edge/contract"
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

// TestStreamFlushesOncePerMessage: the events of one run-event message
// reach the client with one flush, and every message's events are flushed
// before the next message is read (none waits for a later one).
func TestStreamFlushesOncePerMessage(t *testing.T) {
	run := scriptedRun(contract.PathNormalized,
		events(delta("a"), delta("b"), delta("c")),
		events(delta("d")),
		events(usageEvent(1, 4), complete("stop")))
	w := &flushRecorder{ResponseRecorder: httptest.NewRecorder()}
	h := &handler{cfg: Config{}.withDefaults(), logger: slog.New(slog.DiscardHandler)}
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	rr := &runResponse{h: h, w: w, r: r, run: run, req: &Request{Model: "m"}}
	cr := &chatRender{eventReader: eventReader{runResponse: rr}, id: "chatcmpl-x", model: "m"}
	if reason := cr.stream(); reason != reasonCompleted {
		t.Fatalf("stream ended %q", reason)
	}
	body := w.Body.String()
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
