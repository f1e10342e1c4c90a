package api

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"iop/internal/edge/api/access"
	"iop/internal/edge/api/apierror"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/api/request"
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
		flowHeader: access.FlowHeader(cfg.Flow),
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
	// AnyContentType says the route reads its body as JSON whatever its
	// Content-Type (Ollama's clients send none): a key's quota reads it
	// too. Any other route's body is read for a quota only when it is
	// JSON, since the route refuses any other (415).
	AnyContentType bool
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
// any early 400), ServeHTTP then lingers (httpconn.Body.Linger): it sends
// the answer and reads and discards what the client is still sending, up to
// 64 MiB for at most 5 s, so that a client that sends its whole body before
// reading reads the answer instead of a connection reset (RFC 9112 §9.6,
// "Tear-down"; nginx's lingering close does the same). A connection whose
// body did not come whole in that time is then closed, never left to wait
// for the rest.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tw := httpconn.NewWriter(w, h.cfg.WriteTimeout)
	limit, bodyTimeout := h.cfg.MaxBodyBytes, h.cfg.BodyReadTimeout
	if bl, ok := h.cfg.BodyLimits[r.URL.Path]; ok {
		limit, bodyTimeout = cmp.Or(bl.MaxBytes, limit), cmp.Or(bl.ReadTimeout, bodyTimeout)
	}
	body := httpconn.NewBody(w, r, limit)
	r.Body = body
	if r.ContentLength != 0 {
		// Handlers read the body before they answer, except for early
		// errors, after which linger reads the rest itself: net/http must not
		// consume (or give up on) the body when the answer starts.
		_ = tw.Controller().EnableFullDuplex()
		// The body must be in within BodyReadTimeout; the deadline is lifted
		// when it is (httpconn.Body.Read at its end), before any answer.
		if rc := tw.Controller(); rc.SetReadDeadline(time.Now().Add(bodyTimeout)) == nil {
			body.LiftOnEnd(func() { _ = rc.SetReadDeadline(time.Time{}) })
		}
	}
	// net/http keeps a connection's write deadline between requests: start
	// each request with a fresh one (e.g. for a 100 Continue).
	tw.Extend()
	r, obs := h.observe(r)
	tw.Header().Set(requestIDHeader(r), obs.get().RequestID())
	defer func() { h.finish(r.Context(), obs, tw.Status()) }()
	if r, release, ok := h.admit(tw, r); ok {
		defer release()
		h.route(tw, r)
	}
	if !tw.Wrote() {
		h.logger.Debug("aborting a response with nothing written", "path", Clip(r.URL.Path))
		panic(http.ErrAbortHandler)
	}
	if !body.Linger(tw, r) && tw.Header().Get("Content-Length") != "" {
		// The answer is whole on the wire and the rest of the body will
		// not be read: close the connection now (a lingering close),
		// rather than leave it to parse what the client sends next as a
		// request.
		panic(http.ErrAbortHandler)
	}
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
		writeError(w, r, ErrNotFound, nil)
		return
	}
	if rt.Method != "" && r.Method != rt.Method && (rt.Method != http.MethodGet || r.Method != http.MethodHead) {
		w.Header().Set("Allow", rt.Method)
		writeError(w, r, ErrMethodNotAllowed, nil)
		return
	}
	rt.Serve(w, r)
}

// writeError answers a request with the status and OpenAI error body that
// classify maps err to, unless the client has gone away: then it writes
// nothing, logs at debug, and ServeHTTP aborts the connection. It must be
// called before anything else was written to w.
func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
	h.writeShaped(w, r, err, req, openAIShape, "application/json")
}

// openAIShape is the OpenAI routes' ErrorShape: Classify's status and
// {"error":{...}}.
func openAIShape(err error, req *contract.Request) (*apierror.Error, int, any) {
	e := Classify(err, req)
	return e, e.Status(), apierror.Body{Error: e}
}

// logError logs one error answer: server-side failures at warn, client
// mistakes and back-pressure at debug. Client text in it is clipped.
func (h *handler) logError(r *http.Request, e *apierror.Error, err error, req *contract.Request) {
	h.logFailure(r.Context(), r.URL.Path, e, err, req)
}

// logFailure is logError for the request of ctx on path (a run of the
// runs API has no *http.Request of its own).
func (h *handler) logFailure(ctx context.Context, path string, e *apierror.Error, err error, req *contract.Request) {
	level := slog.LevelDebug
	if e.Status() >= 500 {
		level = slog.LevelWarn
	}
	h.logger.Log(ctx, level, "request failed",
		"path", Clip(path), "status", e.Status(), "code", deref(e.Code), "err", errorText(err, req))
}

// logStarted logs a failure that ended an answer after its status line
// was sent: status is the status the client got (the access log's and
// the record's), error_status the one classify maps err to had nothing
// been sent yet.
func (rr *Answer) logStarted(e *apierror.Error, err error) {
	level := slog.LevelDebug
	if e.Status() >= 500 {
		level = slog.LevelWarn
	}
	rr.h.logger.Log(rr.r.Context(), level, "answer failed after it began",
		"path", Clip(rr.r.URL.Path), "status", httpconn.SentStatus(rr.w), "error_status", e.Status(),
		"code", deref(e.Code), "err", errorText(err, rr.req))
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
	httpconn.WriteJSON(w, http.StatusOK, struct {
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
		if errors.Is(err, access.ErrModelNotAllowed) {
			err = ErrUnknownModel // as the listing, which leaves it out
		}
		h.writeError(w, r, err, &contract.Request{Model: id})
		return
	}
	httpconn.WriteJSON(w, http.StatusOK, h.model(id))
}

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	httpconn.WriteText(w, http.StatusOK, "ok")
}

func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	if !h.cfg.Ready() {
		httpconn.WriteText(w, http.StatusServiceUnavailable, "not ready")
		return
	}
	httpconn.WriteText(w, http.StatusOK, "ready")
}

// WriteJSON answers with v as JSON (httpconn.WriteJSON), for the routes
// of the API packages.
func WriteJSON(w http.ResponseWriter, status int, v any) { httpconn.WriteJSON(w, status, v) }

// WriteError answers r, a request the frame is serving, with the status
// and OpenAI error body classify maps err to (writeError): an
// InvalidParam error is 400 invalid_request_error naming its parameter,
// an error of no known kind 500 without its text. For the routes of the
// API packages.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	frameOf(r).writeError(w, r, err, nil)
}

// InvalidParam is the error of a request whose parameter param is
// invalid: WriteError answers it 400 invalid_request_error with message,
// naming param.
func InvalidParam(param, message string) error {
	return &request.FieldError{Field: param, Message: message}
}
