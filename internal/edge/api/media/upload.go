package media

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"iop/internal/edge/api"
	"iop/internal/edge/contract"
)

// A multipart upload is relayed as it comes. The edge reads the body up
// to the end of its "model" field (it routes by it), keeping what it
// read in a spool: in memory up to maxHeldPrefix bytes, beyond that in a
// temporary file (a file part sent before the model, as OpenAI's Node
// SDK and curl's documented examples do). The body that goes to the
// provider is the spool followed by the rest of the client's body, read
// as the run's stream takes it: the edge holds at most maxHeldPrefix
// bytes of it in memory, plus the chunks in flight.

// Bounds of an upload's model field.
const (
	// maxHeldPrefix is the most of the body before the end of its model
	// field held in memory; more goes to a temporary file.
	maxHeldPrefix = 1 << 20
	// maxHeldTotal is the most the spools of all uploads hold in memory
	// at once: past it, a spool goes to its temporary file from its
	// first byte, so many slow uploads cannot hold maxHeldPrefix each.
	maxHeldTotal = 32 << 20
	// tailSize is how much of the spool's end is kept in memory to find
	// the model field's value in it: the multipart reader reads at most a
	// few KiB past the field.
	tailSize = 64 << 10
	// maxModelField bounds the model field's value.
	maxModelField = 1 << 10
)

// errUploadEnded: the request's handler returned; its body is no longer
// to be read.
var errUploadEnded = errors.New("the upload's request ended")

// transcription serves POST /v1/audio/transcriptions: a multipart body
// (OpenAI's: file, model, language, prompt, response_format, ...) read up
// to its model field, then relayed, model field set to the served
// model's name, to a provider with capability "transcription". 400 for a
// body that is not multipart/form-data or has no model field; 413 over
// Config.MaxUploadBytes; 408 when the body pauses longer than
// Config.UploadIdleTimeout (or is not in within UploadReadTimeout).
func (s *server) transcription(w http.ResponseWriter, r *http.Request) {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		api.WriteError(w, r, api.InvalidParam("", "the body must be multipart/form-data with a boundary"))
		return
	}
	boundary := params["boundary"]
	body := newIdleBody(w, r.Body, s.cfg.UploadIdleTimeout, time.Now().Add(s.cfg.UploadReadTimeout))
	defer body.stop()
	sp := &spool{dir: s.cfg.SpoolDir, held: &s.held}
	defer sp.close()
	model, err := readModel(io.TeeReader(body, sp), boundary)
	if err != nil {
		api.WriteError(w, r, err)
		return
	}
	at := sp.valueAt(model, boundary)
	if at < 0 {
		api.WriteError(w, r, api.InvalidParam("model", "the model field is not a plain form field"))
		return
	}
	rest := &gate{r: body}
	defer rest.closed.Store(true)
	ctx, cancel := body.context(r)
	defer cancel()
	r = r.WithContext(ctx)
	headers := map[string]string{"Content-Type": ct}
	if v := r.Header.Get("Accept"); v != "" {
		headers["Accept"] = v
	}
	api.Relay(w, r, "transcription", contract.Request{
		Model:     model,
		Operation: contract.OperationTranscription,
		Needs:     []string{CapTranscription},
		Headers:   headers,
		BodyFrom: func(served string) io.Reader {
			return relayBody(sp, at, model, served, rest, boundary)
		},
	})
}

// relayBody is the body the provider receives: the spool's bytes with
// the model field's value (at) replaced by served, then rest, the
// client's body after the spool, read through a oneModel check: a body
// with another part named "model" fails, at that part's headers, with a
// 400 naming the field, before any byte of it is relayed. Model servers
// disagree on a repeated field (Go's FormValue takes the first,
// Starlette's forms, as vLLM's, the last): the edge routes and checks the
// first, so a second one could run a model the key may not use.
func relayBody(sp *spool, at int64, model, served string, rest io.Reader, boundary string) io.Reader {
	return newOneModel(io.MultiReader(sp.reader(at, model, served), rest), boundary)
}

// errModelRepeated: a multipart body has more than one part named model.
var errModelRepeated = api.InvalidParam("model", "the model field must be given once; the multipart body repeats it")

// errPartHeader: a part's headers are longer than maxPartHeader.
var errPartHeader = api.InvalidParam("", fmt.Sprintf("a part's headers exceed %d KiB", maxPartHeader>>10))

// Bounds of oneModel's scan.
const (
	// maxPartHeader is the most bytes of one part's delimiter line and
	// headers; a body with longer ones is refused (errPartHeader): the
	// edge could not see whether such a part is a second model field, and
	// holds no more of a body in memory than this per part.
	maxPartHeader = 16 << 10
)

// oneModel relays a multipart body as it reads it, and fails it with
// errModelRepeated at the headers of a second part named "model", or
// errPartHeader at headers longer than maxPartHeader. Delimiters and
// header lines may end in CRLF or a bare LF, as Go's multipart reader
// (and others) accept. It keeps at most maxPartHeader + the delimiter's
// length bytes.
type oneModel struct {
	r       io.Reader
	delim   []byte // LF "--" boundary (a CRLF delimiter ends with it too)
	pending []byte // bytes read but not yet scanned past (a delimiter may start in them)
	models  int    // parts named model seen
	closed  bool   // the close delimiter was seen: the epilogue follows
	err     error
}

// newOneModel reads the multipart body r (boundary) through a oneModel.
func newOneModel(r io.Reader, boundary string) *oneModel {
	return &oneModel{r: r, delim: []byte("\n--" + boundary), pending: []byte("\n")}
}

func (o *oneModel) Read(p []byte) (int, error) {
	if o.err != nil {
		return 0, o.err
	}
	n, err := o.r.Read(p)
	if n > 0 && !o.closed {
		o.pending = append(o.pending, p[:n]...)
		if o.err = o.scan(); o.err != nil {
			return 0, o.err
		}
	}
	return n, err
}

// scan looks for part headers in pending: errModelRepeated once a
// second part named model began, errPartHeader for headers too long; it
// drops what it no longer needs.
func (o *oneModel) scan() error {
	for {
		i := bytes.Index(o.pending, o.delim)
		if i < 0 {
			o.pending = keepTail(o.pending, len(o.delim)-1)
			return nil
		}
		head := o.pending[i+len(o.delim):]
		if bytes.HasPrefix(head, []byte("--")) {
			o.closed, o.pending = true, nil
			return nil
		}
		end := headerEnd(head)
		if end < 0 {
			if len(head) > maxPartHeader {
				return errPartHeader
			}
			o.pending = o.pending[i:]
			return nil
		}
		if end > maxPartHeader {
			return errPartHeader
		}
		if mayNameModel(head[:end]) && partName(head[:end]) == "model" {
			o.models++
			if o.models > 1 {
				return errModelRepeated
			}
		}
		o.pending = head[end:]
	}
}

// headerEnd is the index in head (a delimiter line's rest, then a part's
// headers) just past the blank line that ends the headers, CRLF or bare
// LF; -1 when head does not hold it yet.
func headerEnd(head []byte) int {
	for i := 0; ; {
		j := bytes.IndexByte(head[i:], '\n')
		if j < 0 {
			return -1
		}
		j += i
		switch rest := head[j+1:]; {
		case len(rest) >= 1 && rest[0] == '\n':
			return j + 2
		case len(rest) >= 2 && rest[0] == '\r' && rest[1] == '\n':
			return j + 3
		case len(rest) < 2:
			return -1
		}
		i = j + 1
	}
}

// mayNameModel reports whether head could name its part "model": it
// holds "model" in any case, or an encoding a parser decodes (RFC 2231's
// name*=, a quoted-pair, a %-escape). A part it clears is not parsed.
func mayNameModel(head []byte) bool {
	for i := 0; i+5 <= len(head); i++ {
		if c := head[i] | 0x20; c == 'm' && bytes.EqualFold(head[i:i+5], []byte("model")) {
			return true
		}
	}
	return bytes.ContainsAny(head, "*\\%")
}

// keepTail is b's last n bytes, moved to b's start.
func keepTail(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return append(b[:0], b[len(b)-n:]...)
}

// partName is the form name of a part whose delimiter line's rest and
// headers are head (ending in a blank line); "" when it has none.
func partName(head []byte) string {
	line := bytes.IndexByte(head, '\n')
	if line < 0 {
		return ""
	}
	hdr, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(head[line+1:]))).ReadMIMEHeader()
	if err != nil && len(hdr) == 0 {
		return ""
	}
	_, params, err := mime.ParseMediaType(hdr.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["name"]
}

// readModel reads a multipart body up to its model field and returns the
// field's value. Errors are for api.WriteError: the body's read errors
// as the frame answers them (413, 408, ...), else 400.
func readModel(body io.Reader, boundary string) (string, error) {
	mr := multipart.NewReader(newOneModel(body, boundary), boundary)
	for {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			return "", api.InvalidParam("model", "the multipart body has no model field")
		}
		if err != nil {
			return "", bodyError(err)
		}
		if part.FormName() != "model" || part.FileName() != "" {
			if _, err := io.Copy(io.Discard, part); err != nil {
				return "", bodyError(err)
			}
			continue
		}
		v, err := io.ReadAll(io.LimitReader(part, maxModelField+1))
		switch {
		case err != nil:
			return "", bodyError(err)
		case len(v) == 0 || len(v) > maxModelField:
			return "", api.InvalidParam("model", "the model field must hold 1 to 1024 bytes")
		}
		return string(v), nil
	}
}

// bodyError is a multipart read's error: the body's own read error as
// the frame answers it, else a malformed body (400).
func bodyError(err error) error {
	if errors.Is(err, errPartHeader) || errors.Is(err, errModelRepeated) {
		return err
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, io.ErrUnexpectedEOF) {
		return api.BodyError(err)
	}
	return api.InvalidParam("", "the multipart body is malformed: "+clip(err.Error()))
}

// clip bounds a message taken from a parser.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

// spool holds the bytes of a body read before its relay: in memory up to
// maxHeldPrefix while every upload's spools hold less than maxHeldTotal,
// else in a temporary file. Only the request goroutine writes it, before
// the relay reads it.
type spool struct {
	dir  string
	held *memBudget // bytes in memory of every spool; nil: unbounded
	mem  []byte
	file *os.File
	n    int64  // bytes written
	tail []byte // the last tailSize bytes written
	err  error  // the temporary file's failure
}

func (s *spool) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	s.n += int64(len(p))
	s.tail = append(s.tail, p...)
	if len(s.tail) > 2*tailSize {
		s.tail = append(s.tail[:0], s.tail[len(s.tail)-tailSize:]...)
	}
	if s.file == nil && len(s.mem)+len(p) <= maxHeldPrefix && s.hold(len(p)) {
		s.mem = append(s.mem, p...)
		return len(p), nil
	}
	if s.file == nil {
		if s.file, s.err = os.CreateTemp(s.dir, "iop-upload-*"); s.err != nil {
			return 0, s.err
		}
		_ = os.Remove(s.file.Name()) // gone with its last descriptor
		if _, s.err = s.file.Write(s.mem); s.err != nil {
			return 0, s.err
		}
		s.drop()
	}
	if _, s.err = s.file.Write(p); s.err != nil {
		return 0, s.err
	}
	return len(p), nil
}

// valueAt is the offset in the spool of the model field's value model,
// -1 when the field is not found as a plain part (its headers, a blank
// line, the value, the next boundary).
func (s *spool) valueAt(model, boundary string) int64 {
	needle := []byte("\r\n\r\n" + model + "\r\n--" + boundary)
	tail := s.tail
	for end := len(tail); ; {
		i := bytes.LastIndex(tail[:end], needle)
		if i < 0 {
			return -1
		}
		start := bytes.LastIndex(tail[:i], []byte("--"+boundary))
		if start >= 0 && strings.Contains(strings.ToLower(string(tail[start:i])), `name="model"`) {
			return s.n - int64(len(tail)) + int64(i) + 4
		}
		end = i + len(needle) - 1
	}
}

// reader is the spool's bytes with model, the value at "at", replaced by
// served (unchanged when it is the same).
func (s *spool) reader(at int64, model, served string) io.Reader {
	var src io.ReaderAt = bytes.NewReader(s.mem)
	if s.file != nil {
		src = s.file
	}
	if served == model {
		return io.NewSectionReader(src, 0, s.n)
	}
	end := at + int64(len(model))
	return io.MultiReader(io.NewSectionReader(src, 0, at), strings.NewReader(served), io.NewSectionReader(src, end, s.n-end))
}

// memBudget counts the bytes the spools of every upload hold in memory,
// at most max.
type memBudget struct {
	max int64
	n   atomic.Int64
}

// hold counts n more bytes in memory against the budget; false (and
// nothing counted) when they would pass it.
func (s *spool) hold(n int) bool {
	if s.held == nil {
		return true
	}
	if s.held.n.Add(int64(n)) > s.held.max {
		s.held.n.Add(-int64(n))
		return false
	}
	return true
}

// drop lets go of the bytes held in memory.
func (s *spool) drop() {
	if s.held != nil {
		s.held.n.Add(-int64(len(s.mem)))
	}
	s.mem = nil
}

// close drops the temporary file, if any, and the bytes in memory.
func (s *spool) close() {
	if s.file != nil {
		s.file.Close()
	}
	s.drop()
}

// idleBody is an upload's body whose each read waits at most idle for
// bytes: then the connection's read deadline is set to the past, so the
// read fails with os.ErrDeadlineExceeded (api.BodyError: 408), whichever
// goroutine reads (the handler before its relay, the run's stream
// after). Between reads (a queue wait, a provider slow to take the body)
// nothing is watched. A read that brings bytes as its watch fires gets the
// body's whole deadline (UploadReadTimeout from the handler's start) back.
type idleBody struct {
	r        io.Reader
	rc       *http.ResponseController
	idle     time.Duration
	deadline time.Time

	mu      sync.Mutex
	timer   *time.Timer
	reads   uint64 // reads started; a watch acts only for the current one
	reading bool
	fired   bool // the current read's watch set the deadline to the past
	expired bool // a read failed at the watch's deadline
	done    bool // the handler returned: rc is not to be used
}

// newIdleBody watches body's reads on w's connection; deadline is the
// body's whole read deadline.
func newIdleBody(w http.ResponseWriter, body io.Reader, idle time.Duration, deadline time.Time) *idleBody {
	return &idleBody{r: body, rc: http.NewResponseController(w), idle: idle, deadline: deadline}
}

func (b *idleBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	b.reads++
	read := b.reads
	b.reading, b.fired = true, false
	b.timer = time.AfterFunc(b.idle, func() { b.expire(read) })
	b.mu.Unlock()
	n, err := b.r.Read(p)
	b.mu.Lock()
	b.timer.Stop()
	if b.fired && err == nil && !b.done {
		_ = b.rc.SetReadDeadline(b.deadline)
		b.expired = false
	}
	b.reading, b.fired = false, false
	b.mu.Unlock()
	return n, err
}

// expire ends read number read, if it still waits.
func (b *idleBody) expire(read uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done || !b.reading || read != b.reads {
		return
	}
	b.fired, b.expired = true, true
	_ = b.rc.SetReadDeadline(time.Now())
}

// context is r's context, cancelled with it unless the cancel comes from
// a read that failed at the watch's deadline (net/http cancels a request
// whose connection read fails): the run then ends on its body's read
// error, answered 408, not as a client gone; stop ends it.
func (b *idleBody) context(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	unwatch := context.AfterFunc(r.Context(), func() {
		b.mu.Lock()
		expired := b.expired
		b.mu.Unlock()
		if !expired {
			cancel()
		}
	})
	return ctx, func() {
		unwatch()
		cancel()
	}
}

// stop ends the watch; called when the handler returns.
func (b *idleBody) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	if b.timer != nil {
		b.timer.Stop()
	}
}

// gate reads the rest of a request's body for its relay, until the
// request's handler returns; read errors are the frame's (api.BodyError).
type gate struct {
	r      io.Reader
	closed atomic.Bool
}

func (g *gate) Read(p []byte) (int, error) {
	if g.closed.Load() {
		return 0, errUploadEnded
	}
	n, err := g.r.Read(p)
	if err != nil && err != io.EOF {
		err = api.BodyError(err)
	}
	return n, err
}
