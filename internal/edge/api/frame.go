package api

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"iop/internal/edge/api/access"
	"iop/internal/edge/api/apierror"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
)

// Frame is what a client API package serves its routes with: reading and
// checking a request, dispatching it and rendering its run (Serve), and
// answering a failure in the API's shape. New makes one and hands it to
// each of Config.APIs; it is read-only after New.
type Frame struct{ h *handler }

// API makes one client API's routes on f (by exact path; a path ending in
// "/", other than "/" itself, also serves the paths under it that no
// other route serves). It is
// called once, by New; it may register the API's error shape (Errors).
type API func(f *Frame) map[string]Route

// ErrorWriter answers a request with err in an API's shape; req, when not
// nil, is the request being served (its model and needs name the error).
// It must be called before anything else was written to w.
type ErrorWriter func(w http.ResponseWriter, r *http.Request, err error, req *contract.Request)

// ErrorShape maps a failure to an API's answer: the *apierror.Error Classify
// makes of it (for the request's record and log), and the status and the
// JSON body to send.
type ErrorShape func(err error, req *contract.Request) (e *apierror.Error, status int, body any)

// Errors makes write answer the frame's own failures (no such route, a
// key refused, a body too large) on root and the paths under it (root +
// "/..."), for an API whose errors are not OpenAI's.
func (f *Frame) Errors(root string, write ErrorWriter) {
	f.h.errorRoots = append(f.h.errorRoots, errorRoot{root: root, write: write})
}

// Logger is the frame's logger (component edge-api).
func (f *Frame) Logger() *slog.Logger { return f.h.logger }

// Now is the frame's clock (Config.Now).
func (f *Frame) Now() time.Time { return f.h.cfg.Now() }

// ResolveModel is the name Dispatch would take for name, checked against
// the key's models: access.ErrModelNotAllowed (403), ErrUnknownModel (404).
func (f *Frame) ResolveModel(r *http.Request, name string) (string, error) {
	return f.h.resolveModel(r, name)
}

// Models are the model names the request's key may see, in listing order.
func (f *Frame) Models(r *http.Request) []string { return f.h.models(r) }

// ServeModels answers GET /v1/models in OpenAI's shape.
func (f *Frame) ServeModels(w http.ResponseWriter, r *http.Request) { f.h.listModels(w, r) }

// ServeModel answers GET /v1/models/{model} in OpenAI's shape.
func (f *Frame) ServeModel(w http.ResponseWriter, r *http.Request) { f.h.getModel(w, r) }

// Renderer says how a route answers a run: in which error shape, and how
// each execution path's run becomes its answer (each returns the
// rendering's reason, a Reason* value).
type Renderer struct {
	WriteError         ErrorWriter
	Tunnel, Normalized func(a *Answer, info contract.DispatchInfo) string
	// Quiet, when set, is called on the request goroutine each
	// QuietInterval that Dispatch blocks, with the answer, which has no
	// run yet; an error stops the calls. It may start the answer; a
	// Dispatch failure after that is then ended by Failed.
	Quiet         func(a *Answer) error
	QuietInterval time.Duration
	Failed        func(a *Answer, err error) string
}

// Serve dispatches req and answers with its run as rend says; a failed
// dispatch is answered with rend.WriteError. The run is closed exactly
// once before Serve returns, with the request's outcome; an answer cut
// short after its status line aborts the connection.
func (f *Frame) Serve(w http.ResponseWriter, r *http.Request, req *contract.Request, rend Renderer) {
	f.h.serveRunWith(w, r, req, runRenderer{writeError: rend.WriteError, tunnel: rend.Tunnel,
		normalized: rend.Normalized, quiet: rend.Quiet, quietInterval: rend.QuietInterval, failed: rend.Failed})
}

// WriteErrorAs is an ErrorWriter in the shape shape gives, as the
// OpenAI routes' is in theirs: nothing when the client has gone (then
// the connection is aborted), else the status and body shape maps err
// to, with Retry-After when Classify gave one; the failure is recorded
// and logged, and the request's key slot given back.
func (f *Frame) WriteErrorAs(w http.ResponseWriter, r *http.Request, err error, req *contract.Request, shape ErrorShape) {
	f.h.writeShaped(w, r, err, req, shape, "application/json")
}

// writeShaped is WriteErrorAs with the body's Content-Type.
func (h *handler) writeShaped(w http.ResponseWriter, r *http.Request, err error, req *contract.Request, shape ErrorShape, contentType string) {
	if httpconn.ClientGone(r) && !errors.Is(err, httpconn.ErrBodyTimeout) { // a body read past its deadline cancels the context; the client is there
		h.logger.Debug("client gone before the answer", "path", Clip(r.URL.Path), "err", errorText(err, req))
		obsOf(r).get().Failed(err, nil, true)
		return
	}
	e, status, body := shape(err, req)
	obsOf(r).get().Failed(err, e.Code, false)
	h.logError(r, e, err, req)
	access.AnswerFinished(r.Context()) // an error answer ends the request
	if e.RetryAfter() != "" {
		w.Header().Set("Retry-After", e.RetryAfter())
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	httpconn.WriteJSONAs(w, status, contentType, body)
}

// Begin names the request's operation in its record ("anthropic.messages").
func Begin(r *http.Request, operation string) { obsOf(r).get().Begin(operation) }

// ClientStreams records whether the client asked for a streamed answer.
func ClientStreams(r *http.Request, stream bool) { obsOf(r).get().ClientStreams(stream) }

// WriteFailure wraps a failed write to the client, so that a renderer's
// error says the client, not the provider, failed (IsWriteFailure).
func WriteFailure(err error) error { return &errWrite{err} }

// IsWriteFailure reports whether err is or wraps a WriteFailure.
func IsWriteFailure(err error) bool { return errors.As(err, new(*errWrite)) }

// UpstreamFailure is a failure of the provider's answer with status and
// message (clipped to maxErrorTextBytes), answered with that status.
func UpstreamFailure(status int, message string) error {
	return &upstreamError{status: status, message: request.ClipTo(message, maxErrorTextBytes)}
}

// StreamError maps a decoding failure of a tunnel answer (package
// translate's) to the frame's failures; a WriteFailure passes through.
func StreamError(err error) error { return streamError(err) }

// Write writes p to the answer and flushes it (unless a hold is on).
func (rr *Answer) Write(p []byte) error { return rr.write(p) }

// StartStream sends an event stream's status line and headers, once.
func (rr *Answer) StartStream() { rr.startStream() }

// Started reports whether the answer's status line was sent.
func (rr *Answer) Started() bool { return rr.started }

// Run is the answer's run (nil before the dispatch returned).
func (rr *Answer) Run() Run { return rr.run }

// SetRun makes run, which wraps Run's, the one the answer receives from.
func (rr *Answer) SetRun(run Run) { rr.run = run }

// Request is the request dispatched.
func (rr *Answer) Request() *contract.Request { return rr.req }

// HTTPRequest is the client's request.
func (rr *Answer) HTTPRequest() *http.Request { return rr.r }

// ResponseWriter is the client's answer.
func (rr *Answer) ResponseWriter() http.ResponseWriter { return rr.w }

// Content records n events of output in the request's record.
func (rr *Answer) Content(n int) { rr.obs.get().Content(n) }

// Tokens records the provider's token counts in the request's record.
func (rr *Answer) Tokens(in, out int) { rr.obs.get().Tokens(in, out) }

// ErrorCode records the code of the error a started answer ended with.
func (rr *Answer) ErrorCode(code *string) { rr.obs.get().ErrorCode(code) }

// Abort marks a started answer cut short: the connection is aborted
// rather than the body ended as if complete.
func (rr *Answer) Abort() { rr.abort = true }

// FailedEarly ends an answer that failed with err when the API's own
// error rendering has no part in it (a WriteFailure, a failure before the
// status line, a client gone): ended is false when the stream began and
// the client is there, so the caller writes its API's error event.
func (rr *Answer) FailedEarly(err error) (reason string, ended bool) { return rr.failedEarly(err) }

// AnswerFailed marks the answer finished by err, before its last bytes
// (the run ends; a provider's broken answer counts against it).
func (rr *Answer) AnswerFailed(err error) { rr.answerFailed(err) }

// LogStarted logs the failure of a started answer.
func (rr *Answer) LogStarted(e *apierror.Error, err error) { rr.logStarted(e, err) }

// TunnelAnswer reads a tunnel-path run's answer: a 2xx event stream's
// data handed to onSSE as it comes (sse true), any other 2xx body whole;
// an error status or failure as its error (tunnelAnswer).
func (rr *Answer) TunnelAnswer(onSSE func(data []byte) error) (sse bool, body []byte, err error) {
	return rr.tunnelAnswer(onSSE)
}

// Events is how a normalized-path run's events ended: the finish reason,
// the stop sequence that ended the answer, if any, and the provider's
// token counts.
type Events struct {
	Finish, StopSequence           string
	PromptTokens, CompletionTokens int
}

// ReadEvents reads a normalized-path run's events to its end, calling
// onDelta with each delta; an error is the run's failure or onDelta's.
func (rr *Answer) ReadEvents(onDelta func(ev *contract.Event) error) (Events, error) {
	er := &eventReader{Answer: rr}
	finish, err := er.next(onDelta)
	return Events{Finish: finish, StopSequence: er.stopSequence,
		PromptTokens: er.usage.PromptTokens, CompletionTokens: er.usage.CompletionTokens}, err
}

// errorRoot is an API's error writer for a path root (Frame.Errors).
type errorRoot struct {
	root  string
	write ErrorWriter
	// match, when set (Frame.ErrorsFor), says which paths are the API's
	// instead of root.
	match func(path string) bool
}
