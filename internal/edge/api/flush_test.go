package api

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

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

// deadlineWriter records each write and the deadline set before it.
type deadlineWriter struct {
	httptest.ResponseRecorder
	deadlines int
	writes    []int // the deadlines set before each write
}

func (d *deadlineWriter) SetWriteDeadline(time.Time) error { d.deadlines++; return nil }

func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.writes = append(d.writes, d.deadlines)
	return d.ResponseRecorder.Write(p)
}

// TestRegression_SlowReaderGetsADeadlinePerPiece: one write deadline for a
// whole large write cut a client that was still reading, slowly (a
// break-it report: 2 KB/s against a 10 s write_timeout). A large write goes
// out in pieces of at most 16 KiB, each after a fresh deadline, and whole.
func TestRegression_SlowReaderGetsADeadlinePerPiece(t *testing.T) {
	d := &deadlineWriter{ResponseRecorder: *httptest.NewRecorder()}
	w := &trackingWriter{ResponseWriter: d, rc: http.NewResponseController(d), timeout: time.Second}
	body := bytes.Repeat([]byte("x"), 40<<10+1)
	n, err := w.Write(body)
	if err != nil || n != len(body) || !bytes.Equal(d.Body.Bytes(), body) {
		t.Fatalf("wrote %d, %v; the body arrived %v", n, err, bytes.Equal(d.Body.Bytes(), body))
	}
	if !slices.Equal(d.writes, []int{1, 2, 3}) {
		t.Fatalf("deadlines before each write %v, want a fresh one before each of 3 pieces", d.writes)
	}
	if _, err := w.Write([]byte("small")); err != nil || !slices.Equal(d.writes, []int{1, 2, 3, 4}) {
		t.Fatalf("a small write: %v, deadlines %v", err, d.writes)
	}
}
