package httpconn

import (
	"bytes"
	"net/http/httptest"
	"slices"
	"testing"
	"time"
)

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
// whole large write cut a client that was still reading, slowly (2 KB/s
// against a 10 s write_timeout). A large write goes
// out in pieces of at most 16 KiB, each after a fresh deadline, and whole.
func TestRegression_SlowReaderGetsADeadlinePerPiece(t *testing.T) {
	d := &deadlineWriter{ResponseRecorder: *httptest.NewRecorder()}
	w := NewWriter(d, time.Second)
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
