package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"iop/internal/edge/api/bodycoding"
	"iop/internal/edge/contract"
)

// New returns the edge's HTTP handler (routes in the package doc; the
// client APIs of cfg.APIs), serving requests by calling gw, with the
// optional features cfg sets (Admin, Known, ...). A negative
// cfg.MaxBodyBytes is treated as 0 (the default); call cfg.Validate first
// to reject it instead. logger may be nil (then nothing is logged).
func New[R Run](cfg Config, gw Gateway[R], logger *slog.Logger) http.Handler {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &handler{
		flowHeader: flowHeaderOf(cfg.Flow),
		cfg:        cfg.withDefaults(),
		gw:         widened[R]{gw},
		logger:     logger.With("component", "edge-api"),
	}
	h.routes = map[string]Route{
		"/v1/models": {Method: http.MethodGet, Serve: h.listModels},
		"/healthz":   {Method: http.MethodGet, Serve: h.healthz},
		"/readyz":    {Method: http.MethodGet, Serve: h.readyz},
	}
	if h.cfg.Metrics != nil {
		h.routes["/metrics"] = Route{Method: http.MethodGet, Serve: h.cfg.Metrics.ServeHTTP}
	}
	added := maps.Clone(cfg.Routes)
	if added == nil {
		added = map[string]Route{}
	}
	f := &Frame{h: h}
	for _, routes := range cfg.APIs {
		maps.Copy(added, routes(f))
	}
	maps.Copy(h.routes, added)
	for p := range added {
		if strings.HasSuffix(p, "/") && p != "/" {
			h.prefixes = append(h.prefixes, p)
		}
	}
	// The longest prefix serves a path under several.
	slices.SortFunc(h.prefixes, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return h
}

// handler serves every route. All fields are set in New and only read after.
type handler struct {
	cfg    Config
	gw     Gateway[Run]
	logger *slog.Logger
	routes map[string]Route // exact path -> route
	// prefixes are the paths of Config.Routes ending in "/": each also
	// serves the paths under it that no exact route serves.
	prefixes []string
	// flowHeader is the header naming a request's flow (Config.Flow), or "".
	flowHeader string
	// errorRoots are the error writers the APIs registered for their
	// paths (Frame.Errors).
	errorRoots []errorRoot
}

// Route is the one method a path accepts (GET also accepts HEAD) and its
// handler; with Method "", the handler checks the method itself.
type Route struct {
	Method string
	Serve  http.HandlerFunc
	// Operation, on a route whose POST runs a model, is the operation's
	// name in a RequestRecord ("chat.completions", "ollama.chat"): a
	// key's max_concurrent, requests_per_minute and quota count the
	// route's POSTs (admit), and a refusal by them is recorded under it.
	// Only an exact path's route counts. "": the route runs no model.
	Operation string
}

const modelsPrefix = "/v1/models/"

// ServeHTTP routes a request. It caps the body at Config.MaxBodyBytes for
// every route, and ends any handler that wrote nothing (which happens only
// when the client has gone away: see writeError) by aborting the
// connection.
//
// Why abort: net/http cancels a request's context as soon as a read on its
// connection sees EOF, and a client that half-closes its side after sending
// the request (shutdown(SHUT_WR)) causes exactly that while it is still
// reading. If a handler then returned without writing, net/http would
// finish the exchange with an empty "200 OK"; a client still reading would
// take that for an answer. panic(http.ErrAbortHandler) instead closes the
// connection with nothing sent, which every client sees as a failed request.
// (A half-closing client cannot be told apart from one that left, and
// serving it regardless would keep runs going for departed clients.)
//
// A body declared (Content-Length) or found (while read) to be over the
// limit is answered 413 without reading more than the limit. Whenever an
// answer is given before its body was read to the end (413, 415, 404, 405,
// any early 400), ServeHTTP then lingers: it sends the answer and reads and
// discards what the client is still sending, up to lingerBytes for at most
// lingerTime, so that a client that sends its whole body before reading
// reads the answer instead of a connection reset (RFC 9112 §9.6, "Tear-down";
// nginx's lingering close does the same).
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tw := &trackingWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: h.cfg.WriteTimeout}
	limit, bodyTimeout := h.cfg.MaxBodyBytes, h.cfg.BodyReadTimeout
	if bl, ok := h.cfg.BodyLimits[r.URL.Path]; ok {
		limit, bodyTimeout = cmp.Or(bl.MaxBytes, limit), cmp.Or(bl.ReadTimeout, bodyTimeout)
	}
	body := newRequestBody(w, r, limit)
	r.Body = body
	if r.ContentLength != 0 {
		// Handlers read the body before they answer, except for early
		// errors, after which linger reads the rest itself: net/http must not
		// consume (or give up on) the body when the answer starts.
		_ = tw.rc.EnableFullDuplex()
		// The body must be in within BodyReadTimeout; the deadline is lifted
		// when it is (requestBody.Read at its end), before any answer.
		if tw.rc.SetReadDeadline(time.Now().Add(bodyTimeout)) == nil {
			body.lift = func() { _ = tw.rc.SetReadDeadline(time.Time{}) }
		}
	}
	// net/http keeps a connection's write deadline between requests: start
	// each request with a fresh one (e.g. for a 100 Continue).
	tw.extend()
	r, obs := h.observe(r)
	tw.Header().Set(requestIDHeader(r), obs.rec.RequestID)
	defer func() { h.finish(r.Context(), obs, tw.status) }()
	if r, release, ok := h.admit(tw, r); ok {
		defer release()
		h.route(tw, r)
	}
	if !tw.wrote {
		h.logger.Debug("aborting a response with nothing written", "path", Clip(r.URL.Path))
		panic(http.ErrAbortHandler)
	}
	body.linger(tw, r)
}

// requestIDHeader is the answer header that carries the request's id
// (RequestRecord.RequestID), under the name the client's API documents:
// "Request-Id" on Anthropic's routes and to a request that names an
// anthropic-version (GET /v1/models from Anthropic's SDK), which its SDK
// reads as the request id; "X-Request-Id" everywhere else, as OpenAI
// sends it (its SDKs' _request_id). Every answer carries it, errors
// included; a tunnel answer's own header of that name is not relayed.
func requestIDHeader(r *http.Request) string {
	if isAnthropicPath(r.URL.Path) || r.Header.Get(anthropicVersionHeader) != "" {
		return "Request-Id"
	}
	return "X-Request-Id"
}

// anthropicVersionHeader is the header every request of Anthropic's SDKs
// carries (Anthropic API reference, "Versions").
const anthropicVersionHeader = "Anthropic-Version"

// anthropicRoot is the root of Anthropic's Messages API (package
// anthropic): its answers carry Request-Id and Anthropic's rate-limit
// headers.
const anthropicRoot = "/v1/messages"

// isAnthropicPath reports whether path lies under Anthropic's Messages API.
func isAnthropicPath(path string) bool {
	return path == anthropicRoot || strings.HasPrefix(path, anthropicRoot+"/")
}

// errorWriterFor is the error writer of path's API: the one an API
// registered for a root path lies under (Frame.Errors) or for the paths
// it matches (Frame.ErrorsFor), or OpenAI's.
func (h *handler) errorWriterFor(path string) ErrorWriter {
	for _, e := range h.errorRoots {
		if e.match != nil {
			if e.match(path) {
				return e.write
			}
		} else if path == e.root || strings.HasPrefix(path, e.root+"/") {
			return e.write
		}
	}
	return h.writeError
}

// Bounds of ServeHTTP's lingering read after an early answer.
const (
	// lingerBytes is the most of a body read and discarded after the
	// answer; a client sending more may see its connection closed.
	lingerBytes = 64 << 20 // 64 MiB
	// lingerTime bounds the whole lingering read.
	lingerTime = 5 * time.Second
)

// requestBody is a request's body capped at Config.MaxBodyBytes
// (http.MaxBytesReader) that records how far the handler read it. Only the
// request goroutine uses it.
type requestBody struct {
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
	// or by linger.
	lift func()
	// header is the answer's header, for a Connection: close.
	header http.Header
	// encErr is the *encodingError of a body in a coding the edge does not
	// decode: every Read fails with it.
	encErr error
}

// readCloser reads from one reader and closes another.
type readCloser struct {
	io.Reader
	io.Closer
}

// newRequestBody caps r's body at limit bytes. A Content-Length over the
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
// not decode fails every Read with an *encodingError (415).
func newRequestBody(w http.ResponseWriter, r *http.Request, limit int64) *requestBody {
	b := &requestBody{orig: r.Body, limit: limit, header: w.Header()}
	src := r.Body
	codings, unsupported := bodycoding.Parse(r.Header)
	switch {
	case unsupported != "":
		b.encErr = &encodingError{coding: unsupported}
	case len(codings) > 0:
		raw := http.MaxBytesReader(w, r.Body, limit)
		src = readCloser{bodycoding.NewReader(raw, codings), raw}
		r.Header.Del("Content-Encoding")
	}
	b.capped = http.MaxBytesReader(w, src, limit)
	if r.ContentLength > limit {
		b.tooLarge = true
		w.Header().Set("Connection", "close")
	}
	return b
}

func (b *requestBody) Read(p []byte) (int, error) {
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

func (b *requestBody) Close() error { return b.capped.Close() }

// linger, after the handler has answered, sends the answer and reads and
// discards the rest of a body the handler did not read to its end (see
// ServeHTTP), unless the client asked for a 100 Continue that was never
// sent (then it sends no body) or has gone away.
func (b *requestBody) linger(w *trackingWriter, r *http.Request) {
	if b.lift != nil {
		b.lift()
		b.lift = nil
	}
	if b.eof || r.ContentLength == 0 || clientGone(r) {
		return
	}
	if !b.read && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	if w.FlushError() != nil {
		return
	}
	_ = w.rc.SetReadDeadline(time.Now().Add(lingerTime))
	buf := make([]byte, 64<<10) // few reads: io.Discard would read 8 KiB at a time
	for left := lingerBytes; left > 0; {
		n, err := b.orig.Read(buf[:min(left, len(buf))])
		left -= n
		if err != nil {
			break
		}
	}
	_ = w.rc.SetReadDeadline(time.Time{})
}

func (h *handler) route(w http.ResponseWriter, r *http.Request) {
	rt, ok := h.routes[r.URL.Path]
	for _, p := range h.prefixes {
		if !ok && strings.HasPrefix(r.URL.Path, p) {
			rt, ok = h.routes[p], true
		}
	}
	if !ok && strings.HasPrefix(r.URL.Path, modelsPrefix) {
		rt, ok = Route{Method: http.MethodGet, Serve: h.getModel}, true
	}
	writeError := h.errorWriterFor(r.URL.Path)
	if !ok {
		writeError(w, r, errNotFound, nil)
		return
	}
	if rt.Method != "" && r.Method != rt.Method && (rt.Method != http.MethodGet || r.Method != http.MethodHead) {
		w.Header().Set("Allow", rt.Method)
		writeError(w, r, errMethodNotAllowed, nil)
		return
	}
	rt.Serve(w, r)
}

// trackingWriter records whether a handler wrote anything: a status line,
// a body byte, or a flush (which sends the status line). It gives every
// write and flush a fresh write deadline of timeout (Config.WriteTimeout),
// so a client that stops reading fails the write instead of blocking it.
type trackingWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	wrote   bool
	status  int // the status sent; 0 until then
}

// extend moves the connection's write deadline to timeout from now. A
// writer without deadlines (some middleware, tests) keeps none.
func (w *trackingWriter) extend() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
}

func (w *trackingWriter) WriteHeader(status int) {
	w.wrote = true
	if w.status == 0 && status >= 200 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *trackingWriter) Write(p []byte) (int, error) {
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
		w.extend()
		n, err := w.ResponseWriter.Write(piece)
		written += n
		if err != nil || written == len(p) {
			return written, err
		}
	}
}

// writePiece is the most trackingWriter writes under one deadline, in
// bytes.
const writePiece = 16 << 10

// FlushError is here so that a flush through http.ResponseController is
// seen too; the controller finds the other optional methods by Unwrap.
func (w *trackingWriter) FlushError() error {
	w.wrote = true
	w.extend()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.rc.Flush()
}

func (w *trackingWriter) Flush() { _ = w.FlushError() }

func (w *trackingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// writeError answers a request with the status and OpenAI error body that
// classify maps err to, unless the client has gone away: then it writes
// nothing, logs at debug, and ServeHTTP aborts the connection. It must be
// called before anything else was written to w.
func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
	h.writeShaped(w, r, err, req, openAIShape, "application/json")
}

// openAIShape is the OpenAI routes' ErrorShape: Classify's status and
// {"error":{...}}.
func openAIShape(err error, req *contract.Request) (*APIError, int, any) {
	e := Classify(err, req)
	return e, e.status, errorBody{Error: e}
}

// logError logs one error answer: server-side failures at warn, client
// mistakes and back-pressure at debug. Client text in it is clipped.
func (h *handler) logError(r *http.Request, e *APIError, err error, req *contract.Request) {
	h.logFailure(r.Context(), r.URL.Path, e, err, req)
}

// logFailure is logError for the request of ctx on path (a run of the
// runs API has no *http.Request of its own).
func (h *handler) logFailure(ctx context.Context, path string, e *APIError, err error, req *contract.Request) {
	level := slog.LevelDebug
	if e.status >= 500 {
		level = slog.LevelWarn
	}
	h.logger.Log(ctx, level, "request failed",
		"path", Clip(path), "status", e.status, "code", deref(e.Code), "err", errorText(err, req))
}

// logStarted logs a failure that ended an answer after its status line
// was sent: status is the status the client got (the access log's and
// the record's), error_status the one classify maps err to had nothing
// been sent yet.
func (rr *Answer) logStarted(e *APIError, err error) {
	level := slog.LevelDebug
	if e.status >= 500 {
		level = slog.LevelWarn
	}
	rr.h.logger.Log(rr.r.Context(), level, "answer failed after it began",
		"path", Clip(rr.r.URL.Path), "status", sentStatus(rr.w), "error_status", e.status,
		"code", deref(e.Code), "err", errorText(err, rr.req))
}

// sentStatus is the status already written to w: the trackingWriter's
// under any wrapping that unwraps to it, else 200 (what a started answer
// sends unless it said otherwise).
func sentStatus(w http.ResponseWriter) int {
	for w != nil {
		if tw, ok := w.(*trackingWriter); ok && tw.status != 0 {
			return tw.status
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	return http.StatusOK
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// modelObject is one entry of GET /v1/models.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"` // Unix seconds
	OwnedBy string `json:"owned_by"`
}

func (h *handler) model(id string) modelObject {
	return modelObject{ID: id, Object: "model", Created: h.cfg.Now().Unix(), OwnedBy: "iop"}
}

// listModels serves GET /v1/models: {"object":"list","data":[model...]}.
func (h *handler) listModels(w http.ResponseWriter, r *http.Request) {
	names := h.models(r)
	data := make([]modelObject, 0, len(names))
	for _, name := range names {
		data = append(data, h.model(name))
	}
	writeJSON(w, http.StatusOK, struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}{"list", data})
}

// getModel serves GET /v1/models/{model}: the model object of a name the
// chat route takes (resolveModel: also the same name with or without
// ":latest", Ollama's rule), with the id asked for; else 404 (also for a
// model the key may not use, which the listing leaves out).
func (h *handler) getModel(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, modelsPrefix)
	if _, err := h.resolveModel(r, id); err != nil {
		if errors.Is(err, ErrModelNotAllowed) {
			err = ErrUnknownModel // as the listing, which leaves it out
		}
		h.writeError(w, r, err, &contract.Request{Model: id})
		return
	}
	writeJSON(w, http.StatusOK, h.model(id))
}

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	writeText(w, http.StatusOK, "ok")
}

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	if !h.cfg.Ready() {
		writeText(w, http.StatusServiceUnavailable, "not ready")
		return
	}
	writeText(w, http.StatusOK, "ready")
}

// WriteJSON answers with v as JSON (writeJSON), for the routes of the API
// packages.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

// WriteError answers r, a request the frame is serving, with the status
// and OpenAI error body classify maps err to (writeError): an
// InvalidParam error is 400 invalid_request_error naming its parameter,
// an error of no known kind 500 without its text. For the routes of the
// API packages.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	frameOf(r).writeError(w, r, err, nil)
}

// ErrNotFound is the error of a path nothing serves: WriteError answers
// it 404 unknown_url. A prefix route (Config.Routes) answers it for the
// paths under it that it does not serve.
var ErrNotFound = errNotFound

// InvalidParam is the error of a request whose parameter param is
// invalid: WriteError answers it 400 invalid_request_error with message,
// naming param.
func InvalidParam(param, message string) error {
	return &requestError{param: param, message: message}
}

// writeJSON answers with v as JSON (and a newline) and its Content-Length,
// so that the client can read the whole answer even while ServeHTTP still
// lingers on the request body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	writeJSONAs(w, status, "application/json", v)
}

// writeJSONAs is writeJSON with another Content-Type.
func writeJSONAs(w http.ResponseWriter, status int, contentType string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		// Only values of this package are written: a bug, not bad input.
		status, data = http.StatusInternalServerError, []byte(`{"error":{"message":"Internal server error","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	data = append(data, '\n')
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func writeText(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(s))
}

// clientGone reports whether the request's client has gone away (or the
// server is shutting the request down): then nothing more is written.
func clientGone(r *http.Request) bool {
	return r.Context().Err() != nil
}
