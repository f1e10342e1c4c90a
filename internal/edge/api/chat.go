package api

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"iop/internal/edge/api/request"
	"iop/internal/edge/api/stream"
	"iop/internal/edge/contract"
	"iop/internal/sse"
)

// The reasons a run's rendering ends for (the rendering's reason): they
// decide the request's outcome (runOutcome) and appear in the debug line
// "run ended".
const (
	ReasonCompleted     = "completed"
	ReasonClientGone    = "client gone"
	ReasonWriteFailed   = "client write failed"
	ReasonUpstreamError = "upstream error"
	ReasonEdgeStopped   = "edge stopped"
	// ReasonInvalidRequest: the node could not turn the request into its
	// provider's protocol (a *requestError after dispatch).
	ReasonInvalidRequest = "invalid request"
)

// forwardedHeaders are the client headers passed to the provider (canonical
// names). The client's Authorization is for the edge and never forwarded.
var forwardedHeaders = []string{"Accept", "X-Request-Id"}

// readBody reads a request body (ServeHTTP caps it at Config.MaxBodyBytes),
// after checking its Content-Type. Errors: errUnsupportedMedia,
// errBodyTooLarge, or a *requestError when the body cannot be read.
func (h *handler) readBody(r *http.Request) ([]byte, error) {
	if !isJSONContentType(r.Header.Get("Content-Type")) {
		return nil, errUnsupportedMedia
	}
	return readAllBody(r)
}

func forwardHeaders(header http.Header) map[string]string {
	out := make(map[string]string)
	for _, name := range forwardedHeaders {
		if v := header.Get(name); v != "" {
			out[name] = v
		}
	}
	return out
}

// Answer is one dispatched run and the response it is rendered into.
// Only the request goroutine uses it.
type Answer struct {
	h   *handler
	w   http.ResponseWriter
	r   *http.Request
	run Run
	req *contract.Request
	obs *observation // may be nil
	// writeError writes an error answer in the route's shape (OpenAI's
	// writeError, or an API's Renderer.WriteError).
	writeError func(w http.ResponseWriter, r *http.Request, err error, req *contract.Request)
	// started is set once the status line was written; from then on a
	// failure can only end the body.
	started bool
	// abort is set when a started response was cut short: the handler then
	// aborts the connection (http.ErrAbortHandler) rather than let net/http
	// end the body as if it were complete.
	abort bool
	// hold, while set, makes write leave its flush to release; held says
	// something was written under it.
	hold, held bool
	// done is set once the answer was marked finished (answerDone).
	done bool
	// keepSlot, set by a renderer that still has work after the run
	// ended (a stored response's save), makes answerDone leave the key's
	// request slot to it: the renderer gives it back (answerFinished)
	// once that work is done, or the handler does when it returns.
	keepSlot bool
	// eventWriter writes the body's events (events), once it has one.
	eventWriter *sse.Writer
	// recorder, if set, is told of the events of a relayed stream
	// (RelayRecorded).
	recorder func(stream.Event)
}

// recv is Run.Recv with its failures turned into outcomes: io.EOF before a
// message that ends the run means the upstream ended early, any other
// error that the connection to the node was lost (keeping ErrNodeGone &
// co. if wrapped). A message that ends the run (Message.Ends, which the
// edge decided) or a failure means the run has ended at the edge: recv
// then finishes the answer (answerDone) before anything of it is written,
// so the last bytes of the answer always follow.
func (rr *Answer) recv() (contract.Message, error) {
	msg, err := rr.run.Recv()
	if err != nil || msg.Ends {
		rr.answerDone()
	}
	if errors.Is(err, io.EOF) {
		return contract.Message{}, errUpstreamEnded
	}
	if err != nil {
		return contract.Message{}, fmt.Errorf("%w: %w", errUpstreamLost, err)
	}
	return msg, nil
}

// answerDone marks the answer finished before its last bytes are written:
// it ends the run at the edge if it has not ended (a failure the renderer
// found itself, such as a malformed message; the node is told to stop) and
// gives the key's request slot back (answerFinished). It is idempotent.
// This is the one point where a request stops counting against its key's
// max_concurrent: after its run released its lease, before the client can
// see the end of the answer — unless keepSlot is set (a stored Responses
// answer keeps it until its save is done, then gives it back itself).
func (rr *Answer) answerDone() {
	if rr.done {
		return
	}
	rr.done = true
	if rr.run != nil { // nil: the dispatch failed after the answer began
		rr.run.Cancel("the edge ended the answer")
	}
	if !rr.keepSlot {
		answerFinished(rr.r.Context())
	}
}

// answerFailed is answerDone for an answer that ends with err: when err
// says the provider's answer was broken (providerBroke), the run ends as
// the provider's failure (Run.Fail), for its circuit breaker.
func (rr *Answer) answerFailed(err error) {
	if !rr.done && rr.run != nil && providerBroke(err) {
		rr.run.Fail(errorText(err, rr.req))
	}
	rr.answerDone()
}

// providerBroke reports whether err, the end of an answer, is a failure
// of the provider's answer the API found: an answer that breaks the
// protocol or ends early, or a failure of status 429, 500 and above (or
// none: the node's 502), the statuses a terminal failure message counts
// for (edge.lateFailure). A failure the edge reported already counted;
// the breaker counts each run once.
func providerBroke(err error) bool {
	var ue *upstreamError
	switch {
	case errors.Is(err, ErrUpstreamProtocol), errors.Is(err, errUpstreamEnded):
		return true
	case errors.As(err, &ue):
		return ue.status == 0 || ue.status == http.StatusTooManyRequests || ue.status >= 500
	}
	return false
}

// fail ends a response that failed before its status line: an error answer,
// or nothing if the client is gone (then ServeHTTP aborts the connection).
// It returns the rendering's reason.
func (rr *Answer) fail(err error) string {
	if clientGone(rr.r) {
		rr.h.logger.Debug("client gone", "path", Clip(rr.r.URL.Path), "err", errorText(err, rr.req))
		return ReasonClientGone
	}
	rr.answerFailed(err)
	rr.writeError(rr.w, rr.r, err, rr.req)
	if errors.As(err, new(*requestError)) || errors.As(err, new(*request.FieldError)) {
		return ReasonInvalidRequest
	}
	return ReasonUpstreamError
}

// flush sends what was written so far to the client.
// A writer that cannot flush (some middleware) still delivers the bytes,
// later, so that is not a failure.
func (rr *Answer) flush() error {
	if err := http.NewResponseController(rr.w).Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

// write writes p and flushes it, unless a hold is on: then the flush waits
// for release.
func (rr *Answer) write(p []byte) error {
	if _, err := rr.w.Write(p); err != nil {
		return err
	}
	if rr.hold {
		rr.held = true
		return nil
	}
	return rr.flush()
}

// release ends a hold and flushes what was written under it. Holding the
// flushes of the events that came in one message sends them in one write
// to the client (BENCHMARKS.md: a flush per chunk was 39% of the edge's CPU
// on a streamed normalized run); no event waits for a later message.
func (rr *Answer) release() error {
	rr.hold = false
	if !rr.held {
		return nil
	}
	rr.held = false
	return rr.flush()
}

// isJSONContentType reports whether a request's Content-Type allows a JSON
// body: absent, application/json, or any type with a "+json" suffix.
func isJSONContentType(header string) bool {
	if header == "" {
		return true
	}
	mediaType, _, err := mime.ParseMediaType(header)
	if err != nil {
		return false
	}
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
