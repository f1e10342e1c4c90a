package httpconn

import (
	"net/http"
	"time"
)

// Writer records whether a handler wrote anything: a status line,
// a body byte, or a flush (which sends the status line). It gives every
// write and flush a fresh write deadline of timeout (Config.WriteTimeout),
// so a client that stops reading fails the write instead of blocking it.
type Writer struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	wrote   bool
	status  int // the status sent; 0 until then
}

// Extend moves the connection's write deadline to timeout from now. A
// writer without deadlines (some middleware, tests) keeps none.
func (w *Writer) Extend() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
}

func (w *Writer) WriteHeader(status int) {
	w.wrote = true
	if w.status == 0 && status >= 200 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *Writer) Write(p []byte) (int, error) {
	w.wrote = true
	if w.status == 0 {
		w.status = http.StatusOK
	}
	// In pieces of writePiece bytes, each with a fresh deadline: a client
	// that keeps reading, however slowly, makes progress within every
	// deadline, so only one that stops (takes longer than the timeout to
	// take writePiece bytes) is cut. One deadline for a whole large write
	// would cut a slow reader that is still reading (2 KB/s against a 10 s
	// timeout).
	written := 0
	for {
		piece := p[written:min(len(p), written+writePiece)]
		w.Extend()
		n, err := w.ResponseWriter.Write(piece)
		written += n
		if err != nil || written == len(p) {
			return written, err
		}
	}
}

// writePiece is the most a Writer writes under one deadline, in
// bytes.
const writePiece = 16 << 10

// FlushError is here so that a flush through http.ResponseController is
// seen too; the controller finds the other optional methods by Unwrap.
func (w *Writer) FlushError() error {
	w.wrote = true
	w.Extend()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.rc.Flush()
}

func (w *Writer) Flush() { _ = w.FlushError() }

func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// NewWriter wraps w, giving each write and flush a write deadline of
// timeout from then (none for a writer without deadlines).
func NewWriter(w http.ResponseWriter, timeout time.Duration) *Writer {
	return &Writer{ResponseWriter: w, rc: http.NewResponseController(w), timeout: timeout}
}

// Controller is the http.ResponseController of the wrapped writer (read
// deadlines, full duplex).
func (w *Writer) Controller() *http.ResponseController { return w.rc }

// Wrote reports whether anything was written: a status line, a body
// byte or a flush.
func (w *Writer) Wrote() bool { return w.wrote }

// Status is the status sent: 0 until then.
func (w *Writer) Status() int { return w.status }
