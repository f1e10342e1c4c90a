package httpconn

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"iop/internal/edge/api/bodycoding"
	"iop/internal/edge/api/request"
)

// Bounds of the frame's lingering read after an early answer.
const (
	// lingerBytes is the most of a body read and discarded after the
	// answer; a client sending more may see its connection closed.
	lingerBytes = 64 << 20 // 64 MiB
	// lingerTime bounds the whole lingering read.
	lingerTime = 5 * time.Second
)

// Body is a request's body capped at a limit (http.MaxBytesReader; the
// edge API's Config.MaxBodyBytes) that records how far the handler read
// it. Only the request goroutine uses it.
type Body struct {
	orig   io.ReadCloser // the body as net/http gave it
	capped io.ReadCloser // orig behind http.MaxBytesReader
	limit  int64
	read   bool // Read was called: a 100 Continue was sent, if asked for
	eof    bool // the body was read to its end
	// tooLarge: the body is over the limit, by its Content-Length or by
	// what was read. Every Read then fails with *http.MaxBytesError.
	tooLarge bool
	// lift, when set, lifts the connection's read deadline for the body
	// (Config.BodyReadTimeout); called once the body is read to its end,
	// or by Linger.
	lift func()
	// header is the answer's header, for a Connection: close.
	header http.Header
	// encErr is the *EncodingError of a body in a coding the edge does not
	// decode: every Read fails with it.
	encErr error
}

// ReadCloser reads from one reader and closes another.
type ReadCloser struct {
	io.Reader
	io.Closer
}

// NewBody caps r's body at limit bytes. A Content-Length over the
// limit fails the first Read at once, without reading anything (so a
// client waiting for a 100 Continue is never asked for the body), and
// marks the answer Connection: close, as net/http does for a body over a
// MaxBytesReader's limit.
//
// A body with a Content-Encoding (bodycoding.Parse: gzip, deflate) is decoded as
// it is read, and the limit counts the decoded bytes (a small compressed
// body that decodes to more is 413, without decoding more than the limit)
// as well as the bytes received; the header is then removed, so that
// nothing after reads the decoded body as encoded. A coding the edge does
// not decode fails every Read with an *EncodingError (415).
func NewBody(w http.ResponseWriter, r *http.Request, limit int64) *Body {
	b := &Body{orig: r.Body, limit: limit, header: w.Header()}
	src := r.Body
	codings, unsupported := bodycoding.Parse(r.Header)
	switch {
	case unsupported != "":
		b.encErr = &EncodingError{Coding: unsupported}
	case len(codings) > 0:
		raw := http.MaxBytesReader(w, r.Body, limit)
		src = ReadCloser{bodycoding.NewReader(raw, codings), raw}
		r.Header.Del("Content-Encoding")
	}
	b.capped = http.MaxBytesReader(w, src, limit)
	if r.ContentLength > limit {
		b.tooLarge = true
		w.Header().Set("Connection", "close")
	}
	return b
}

func (b *Body) Read(p []byte) (int, error) {
	if b.tooLarge {
		return 0, &http.MaxBytesError{Limit: b.limit}
	}
	if b.encErr != nil {
		return 0, b.encErr
	}
	b.read = true
	n, err := b.capped.Read(p)
	if err == io.EOF {
		b.eof = true
		if b.lift != nil {
			// Nothing after the body may hit its deadline (with full duplex
			// net/http reads no more itself; this keeps it so should that
			// change, and for a handler that reads past the body).
			b.lift()
			b.lift = nil
		}
	} else if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		b.tooLarge = true
	} else if errors.Is(err, os.ErrDeadlineExceeded) && b.header != nil {
		// The rest of the body may still come: the connection cannot
		// carry another request (its 408 says so).
		b.header.Set("Connection", "close")
	}
	return n, err
}

func (b *Body) Close() error { return b.capped.Close() }

// Linger, after the handler has answered, sends the answer and reads and
// discards the rest of a body the handler did not read to its end (see
// the edge API's ServeHTTP), unless the client asked for a 100 Continue that was never
// sent (then it sends no body) or has gone away. It reports whether the
// body was read to its end, so that the connection may carry another
// request. When it was not, the connection's read deadline is left
// expired: net/http reads up to 256 KiB of what is left of a body after
// the handler, to reuse the connection, and with no deadline that read
// waited on a client that sent nothing more for as long as the client
// kept the connection (and held a graceful stop for its whole drain).
func (b *Body) Linger(w *Writer, r *http.Request) (ended bool) {
	if b.lift != nil {
		b.lift()
		b.lift = nil
	}
	if b.eof || r.ContentLength == 0 {
		return true
	}
	defer func() {
		if ended {
			_ = w.rc.SetReadDeadline(time.Time{})
			return
		}
		_ = w.FlushError() // the answer is on the wire before the connection may close
		_ = w.rc.SetReadDeadline(time.Now())
	}()
	if ClientGone(r) {
		return false
	}
	if !b.read && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return false
	}
	if w.FlushError() != nil {
		return false
	}
	_ = w.rc.SetReadDeadline(time.Now().Add(lingerTime))
	buf := make([]byte, 64<<10) // few reads: io.Discard would read 8 KiB at a time
	for left := lingerBytes; left > 0; {
		n, err := b.orig.Read(buf[:min(left, len(buf))])
		left -= n
		if err == io.EOF {
			return true
		}
		if err != nil {
			break
		}
	}
	return false
}

// LiftOnEnd sets lift, which lifts the connection's read deadline for the
// body: called once, when the body is read to its end or by Linger.
func (b *Body) LiftOnEnd(lift func()) { b.lift = lift }

// EncodingError is a request body in a Content-Encoding the edge does not
// decode (bodycoding.Parse's unsupported): 415, naming it.
type EncodingError struct{ Coding string }

func (e *EncodingError) Error() string {
	return fmt.Sprintf("unsupported Content-Encoding %q: send the body as identity, gzip or deflate", request.Clip(e.Coding))
}
