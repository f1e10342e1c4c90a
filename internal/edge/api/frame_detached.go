package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"iop/internal/edge/contract"
)

// WriteError is the OpenAI routes' ErrorWriter: the status and OpenAI
// error body Classify maps err to (req, when not nil, names the model);
// nothing when the client has gone (the connection is then aborted).
func (f *Frame) WriteError(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
	f.h.writeError(w, r, err, req)
}

// ErrMethodNotAllowed is the error of a method a route does not serve:
// WriteError answers it 405 (the caller sets Allow).
var ErrMethodNotAllowed = errMethodNotAllowed

// KeyName is the name of the API key of the request whose context is ctx
// ("" on an open API).
func KeyName(ctx context.Context) string { return keyName(ctx) }

// ForwardHeaders are the client's headers a run carries to its provider
// (by canonical name), as the chat route forwards them.
func ForwardHeaders(header http.Header) map[string]string { return forwardHeaders(header) }

// ClientGone reports whether the client of r has gone (its context ended
// for a reason other than a body read past its deadline).
func ClientGone(r *http.Request) bool { return clientGone(r) }

// AnswerFinished gives the key's request slot of the request whose
// context is ctx back, once (also one taken over by KeepPermit): its
// answer is written and it occupies no provider any more.
func AnswerFinished(ctx context.Context) { answerFinished(ctx) }

// KeepPermit takes over the key's request slot of the request whose
// context is ctx, for a run that goes on after the request ends (a
// background run): the slot is given back by calling the returned func
// (once) or by AnswerFinished, not when the request ends. Without a slot
// it returns a no-op.
func KeepPermit(ctx context.Context) func() { return keepPermit(ctx) }

// RecordRequest records req, decoded, in r's request record and returns
// the record's request id ("" without a record).
func RecordRequest(r *http.Request, req *contract.Request) (requestID string) {
	obs := obsOf(r)
	obs.request(req)
	return obs.requestID()
}

// HandOff drops r's request record: the run it started records the
// request when it ends (ServeDetached).
func HandOff(r *http.Request) { obsOf(r).handOff() }

// ErrorJSON is the OpenAI error body {"error":{...}} of type typ, code
// and message, with no param.
func ErrorJSON(typ, code, message string) []byte {
	b, _ := json.Marshal(errorBody{Error: newAPIError(0, typ, "", code, message)})
	return b
}

// KeepSlot keeps the key's request slot after the run ends: the renderer
// still has work (a stored response's save) and gives it back itself
// (AnswerFinished).
func (rr *Answer) KeepSlot() { rr.keepSlot = true }

// Fail ends an answer that failed with err before its status line: an
// error answer in the route's shape, or nothing if the client is gone.
// It returns the rendering's reason.
func (rr *Answer) Fail(err error) string { return rr.fail(err) }

// WriteFailed is the reason of a failed write to the client; the answer
// is aborted.
func (rr *Answer) WriteFailed(err error) string { return rr.writeFailed(err) }

// Detached is how a request served by ServeDetached ended: its answer's
// HTTP status, the body of an error answer (status ≥ 300, its first
// maxErrorBody bytes), and the outcome of its record.
type Detached struct {
	Status    int
	ErrorBody []byte
	Outcome   string
}

// ServeDetached serves req as Serve does, with no client connection: for
// a run that goes on after its request ended (a background response).
// It keeps its own request record: operation its API, requestID its id,
// the key of ctx; a POST to path is what the record and the errors name.
// The answer is rendered into nothing but its status and error body.
func (f *Frame) ServeDetached(ctx context.Context, requestID, operation, path string, req *contract.Request, rend Renderer) Detached {
	h := f.h
	obs := &observation{now: h.cfg.Now}
	obs.rec.Start = obs.now()
	obs.rec.API, obs.rec.RequestID, obs.rec.Key = operation, requestID, keyName(ctx)
	ctx = context.WithValue(ctx, observationKey{}, obs)
	dw := &detachedWriter{header: http.Header{}}
	hr := (&http.Request{Method: http.MethodPost, URL: &url.URL{Path: path}, Header: http.Header{}}).WithContext(ctx)
	func() {
		defer func() {
			// A rendering cut short aborts its (here absent) connection.
			if p := recover(); p != nil && p != http.ErrAbortHandler {
				panic(p)
			}
		}()
		h.serveRunWith(dw, hr, req, runRenderer{writeError: rend.WriteError, tunnel: rend.Tunnel,
			normalized: rend.Normalized, quiet: rend.Quiet, quietInterval: rend.QuietInterval, failed: rend.Failed})
	}()
	h.finish(ctx, obs, dw.status)
	return Detached{Status: dw.status, ErrorBody: dw.body, Outcome: string(obs.rec.Outcome)}
}

// detachedWriter is the http.ResponseWriter of ServeDetached: it keeps the
// status and, for an error answer, the body.
type detachedWriter struct {
	header http.Header
	status int
	body   []byte
}

func (d *detachedWriter) Header() http.Header { return d.header }

func (d *detachedWriter) WriteHeader(status int) {
	if d.status == 0 {
		d.status = status
	}
}

func (d *detachedWriter) Write(p []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	if d.status >= 300 && len(d.body) < maxErrorBody {
		d.body = append(d.body, p...)
	}
	return len(p), nil
}

// NotFound is the error of a resource the request names that its key has
// none of (a stored response): WriteError answers it 404
// invalid_request_error, code not_found, with message.
func NotFound(message string) error { return &notFoundError{message} }

// notFoundError is NotFound's error.
type notFoundError struct{ message string }

func (e *notFoundError) Error() string { return e.message }

// responsesPath is the path of POST /v1/responses (package responses):
// a quota clamps its max_output_tokens.
const responsesPath = "/v1/responses"
