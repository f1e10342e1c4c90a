package api

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"iop/internal/edge/api/stream"
	"iop/internal/edge/contract"
	"iop/internal/sse"
)

// hopHeaders are response headers of the provider's connection, not of its
// answer, so they are not relayed. Content-Length goes too: the edge sets
// its own from what the node says of the body (the head's ContentLength,
// or the whole body in one message), and a length that no longer matched
// would corrupt the response.
var hopHeaders = map[string]bool{
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
	"Content-Length":      true,
}

// ownHeaders are response headers the edge sets itself on every answer
// (requestIDHeader): a provider's of the same name is not relayed.
var ownHeaders = map[string]bool{"X-Request-Id": true, "Request-Id": true}

// tunnelBytesRead counts the bytes of tunnel event streams fed to a
// stream.FinalHold's reader, as the reader counted them
// (stream.FinalHold.Fed): a test hook, so a test can tell that each
// relayed chunk is parsed once.
var tunnelBytesRead atomic.Int64

// tunnel relays a tunnel-path run: the head event becomes the status and
// headers (as received, minus hopHeaders; flushed at once for an event
// stream, else with the first data), each data event is read once by
// stream.FinalHold (which tells the observation of its content and usage) and
// written and flushed at once, but for the bytes that end the answer,
// which the hold keeps until the end event: the answer is finished (answerDone, in recv)
// before its last bytes are written. The end event ends the response (one
// with ProviderError, an error event the provider sent inside its 2xx
// stream and the client got as is, ends it the same way but the run counts
// as failed: logged at warn, reason "upstream error"; so does an error
// status the provider answered, relayed whole). A failure before the head
// is an error answer (the failure's status, 502 if unset);
// after it, see failStarted (the held bytes are dropped: a failed stream
// must not end with the provider's [DONE]). It returns the reason the
// rendering ended for.
//
// A head may carry the body's start, or the whole body with End (one
// message from the node: contract.TunnelParts); the parts of one message
// go to the client with one flush, so a whole answer is one write. A body
// that is not an event stream gets a Content-Length (RFC 9110 section
// 8.6) when the edge knows its length before it writes it: the whole body
// came with the head, or the head declared it (ContentLength); else it is
// sent chunked. A body that turns out longer or shorter than it declared is
// a broken answer (ErrUpstreamProtocol, errUpstreamEnded): the response is
// aborted, never ended as if it were complete.
func (rr *Answer) tunnel() string {
	hold := stream.FinalHold{Record: rr.recorder}
	if rr.obs != nil {
		hold.Observer = rr.obs
	}
	defer func() { tunnelBytesRead.Add(hold.Fed()) }()
	status := 0 // the head's
	// declared is the Content-Length the client was told, -1 for none;
	// fed counts the body's bytes so far.
	declared, fed := int64(-1), int64(0)
	// part handles one tunnel event; done says the rendering ended with
	// reason.
	part := func(ev contract.Event) (reason string, done bool) {
		switch ev.Kind {
		case contract.EventHead:
			if rr.started {
				return rr.tunnelFail(ErrUpstreamProtocol, hold.SSE), true
			}
			status = ev.Status
			if status < 200 || status > 599 {
				return rr.fail(ErrUpstreamProtocol), true
			}
			// header.Set, with the values of all the headers (the
			// Content-Length's too) in one allocation; each one's capacity
			// is its length, so that a later Add copies it rather than
			// overwrite its neighbour.
			header := rr.w.Header()
			values := make([]string, 0, len(ev.Headers)+1)
			for name, value := range ev.Headers {
				name = http.CanonicalHeaderKey(name)
				if !hopHeaders[name] && !ownHeaders[name] {
					values = append(values, value)
					n := len(values)
					header[name] = values[n-1 : n : n]
				}
			}
			hold.SSE = sse.IsEventStream(header.Get("Content-Type"))
			if !hold.SSE && bodyAllowed(status) {
				switch {
				case ev.End:
					declared = int64(len(ev.Data))
				case ev.ContentLength > 0:
					declared = ev.ContentLength
				}
				if declared >= 0 {
					values = append(values, strconv.FormatInt(declared, 10))
					n := len(values)
					header["Content-Length"] = values[n-1 : n : n]
				}
			}
			rr.w.WriteHeader(status)
			rr.started = true
			// The head of a stream goes at once (with the bytes that came
			// with it); any other answer's goes with its first data, one
			// write fewer (BENCHMARKS.md).
			if hold.SSE {
				if err := rr.flushOrHold(); err != nil {
					return rr.writeFailed(err), true
				}
			}
		case contract.EventData:
			if !rr.started {
				return rr.fail(ErrUpstreamProtocol), true
			}
			if fed += int64(len(ev.Data)); declared >= 0 && fed > declared {
				return rr.tunnelFail(ErrUpstreamProtocol, hold.SSE), true // longer than it said
			}
			if p := hold.Split(ev.Data); len(p) > 0 {
				if err := rr.write(p); err != nil {
					return rr.writeFailed(err), true
				}
			}
		case contract.EventEnd:
			if !rr.started {
				return rr.fail(errUpstreamEnded), true
			}
			if declared >= 0 && fed != declared {
				return rr.tunnelFail(errUpstreamEnded, hold.SSE), true // shorter than it said
			}
			if p := hold.Rest(); len(p) > 0 {
				if err := rr.write(p); err != nil {
					return rr.writeFailed(err), true
				}
			}
			if err := rr.release(); err != nil {
				return rr.writeFailed(err), true
			}
			if msg := ev.ProviderError; msg != "" {
				// The provider's error event reached the client with its
				// bytes; the run failed all the same.
				rr.h.logger.Warn("provider reported an error inside its answer", "path", Clip(rr.r.URL.Path),
					"model", Clip(rr.req.Model), "err", clipTo(msg, maxErrorTextBytes))
				return ReasonUpstreamError, true
			}
			if status >= 400 {
				// The provider's error answer was relayed whole; the run
				// failed, as it does on the normalized path.
				return ReasonUpstreamError, true
			}
			return ReasonCompleted, true
		case contract.EventFailure:
			return rr.tunnelFail(failureError(ev), hold.SSE), true
		default:
			return rr.tunnelFail(ErrUpstreamProtocol, hold.SSE), true
		}
		return "", false
	}
	for {
		msg, err := rr.recv()
		if err != nil {
			return rr.tunnelFail(err, hold.SSE)
		}
		if !msg.Tunnel {
			return rr.tunnelFail(ErrUpstreamProtocol, hold.SSE)
		}
		parts, n := contract.TunnelParts(msg)
		rr.hold = n > 1 // one flush for the parts of one message
		for _, ev := range parts[:n] {
			if reason, done := part(ev); done {
				_ = rr.release() // a failure's last write; the reason says how it ended
				return reason
			}
		}
		if err := rr.release(); err != nil {
			return rr.writeFailed(err)
		}
	}
}

// bodyAllowed reports whether a response of status may have a body, and so
// a Content-Length (RFC 9110 sections 8.6, 15.3.5, 15.4.5: not a 204 or
// 304).
func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// flushOrHold flushes what was written, or under a hold leaves the flush to
// release.
func (rr *Answer) flushOrHold() error {
	if rr.hold {
		rr.held = true
		return nil
	}
	return rr.flush()
}

// tunnelFail ends a tunnel-path response that failed with err.
func (rr *Answer) tunnelFail(err error, sse bool) string {
	if !rr.started {
		return rr.fail(err)
	}
	return rr.failStarted(err, sse)
}

// failedEarly ends a translated answer (Ollama, Responses, Messages) that
// failed with err, when its own error rendering has no part in it: a
// failed write to the client (an *errWrite) is writeFailed; a failure
// before the status line is an error answer (fail); a client gone after
// it aborts the connection. ended is false when none of these holds: the
// stream began and the client is there, so the caller writes its API's
// error event.
func (rr *Answer) failedEarly(err error) (reason string, ended bool) {
	var werr *errWrite
	if errors.As(err, &werr) {
		return rr.writeFailed(werr.err), true
	}
	if !rr.started {
		return rr.fail(err), true
	}
	if clientGone(rr.r) {
		rr.h.logger.Debug("client gone", "path", Clip(rr.r.URL.Path), "err", errorText(err, rr.req))
		rr.abort = true
		return ReasonClientGone, true
	}
	return "", false
}

// failStarted ends a response whose status line was already sent. An SSE
// body gets one `data: {"error":{...}}` event (no [DONE]); any other body
// cannot signal an error, so it is marked for abort (rr.abort) and the
// client sees a truncated response rather than a complete-looking one. A
// response whose client is gone is marked for abort too: a client that only
// half-closed its connection may still be reading. It returns the Close
// reason.
func (rr *Answer) failStarted(err error, sse bool) string {
	if clientGone(rr.r) {
		rr.h.logger.Debug("client gone", "path", Clip(rr.r.URL.Path), "err", errorText(err, rr.req))
		rr.abort = true
		return ReasonClientGone
	}
	rr.answerFailed(err)
	e := Classify(err, rr.req)
	rr.logStarted(e, err)
	rr.obs.errorCode(e.Code)
	if !sse {
		rr.abort = true
		return ReasonUpstreamError
	}
	if werr := rr.writeEvent(errorBody{Error: e}); werr != nil {
		rr.abort = true
		return ReasonWriteFailed
	}
	rr.recordError(e)
	return ReasonUpstreamError
}

// writeFailed is the outcome of a failed write to the client. The response
// is marked for abort: whatever part of it was sent must not end cleanly.
func (rr *Answer) writeFailed(err error) string {
	rr.abort = true
	if clientGone(rr.r) {
		return ReasonClientGone
	}
	rr.h.logger.Debug("writing the response failed", "path", Clip(rr.r.URL.Path), "err", err)
	return ReasonWriteFailed
}

// writeEvent writes v as one SSE event, `data: <json>\n\n`, and flushes it
// (unless a hold is on).
func (rr *Answer) writeEvent(v any) error { return rr.events().JSON("", v) }

// events is the SSE writer of the response's body, whose writes go
// through write (and its hold).
func (rr *Answer) events() *sse.Writer {
	if rr.eventWriter == nil {
		rr.eventWriter = sse.NewWriter(writeFunc(rr.write))
	}
	return rr.eventWriter
}

// writeFunc is a write that reports only its error as an io.Writer.
type writeFunc func(p []byte) error

func (f writeFunc) Write(p []byte) (int, error) {
	if err := f(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// eventReader reads the run events of a normalized-path run.
type eventReader struct {
	*Answer
	usage stream.Usage
	// stopSequence is the request's stop sequence that ended the answer,
	// once the end event said one did.
	stopSequence string
}

// next reads run events until one ends the run, calling onDelta for each
// delta that carries text, reasoning (thinking), tool calls or embeddings;
// each counts as generated content for the observation, reasoning too (a
// reasoning model's first token is its reasoning: that is its time to
// first token). A usage event is recorded in e.usage. It returns the
// finish reason ("stop" if the node sent none) or the failure.
func (e *eventReader) next(onDelta func(ev *contract.Event) error) (finish string, err error) {
	for {
		msg, err := e.recv()
		if err != nil {
			return "", err
		}
		if msg.Tunnel {
			return "", ErrUpstreamProtocol
		}
		// The events of one message are written with one flush.
		e.hold = true
		finish, done, err := e.handle(msg.Events, onDelta)
		if rerr := e.release(); rerr != nil && err == nil {
			err = &errWrite{rerr}
		}
		if done || err != nil {
			return finish, err
		}
	}
}

// handle handles the events of one message, as next describes; done is set
// when one of them ended the run.
func (e *eventReader) handle(events []contract.Event, onDelta func(ev *contract.Event) error) (finish string, done bool, err error) {
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case contract.EventDelta: // the edge leaves out deltas without content
			e.obs.content(1)
			if err := onDelta(ev); err != nil {
				return "", true, err
			}
		case contract.EventUsage:
			e.usage.PromptTokens = ev.PromptTokens
			e.usage.CompletionTokens = ev.CompletionTokens
			e.usage.TotalTokens = e.usage.PromptTokens + e.usage.CompletionTokens
			e.obs.tokens(e.usage.PromptTokens, e.usage.CompletionTokens)
		case contract.EventEnd:
			finish := ev.FinishReason
			if finish == "" {
				finish = "stop"
			}
			e.stopSequence = ev.StopSequence
			e.obs.finished(finish)
			return finish, true, nil
		case contract.EventFailure:
			return "", true, failureError(*ev)
		}
	}
	return "", false, nil
}

// errWrite marks a failed write to the client, as opposed to a failed run.
type errWrite struct{ err error }

func (e *errWrite) Error() string { return "write: " + e.err.Error() }
func (e *errWrite) Unwrap() error { return e.err }

// MaxToolCalls bounds the index of a tool call in one answer, so a
// malformed index from a node cannot make the edge allocate without bound.
const MaxToolCalls = 1024

// startStream sends the SSE status line and headers, once.
func (rr *Answer) startStream() {
	if rr.started {
		return
	}
	header := rr.w.Header()
	header.Set("Content-Type", "text/event-stream")
	header.Set("Cache-Control", "no-cache")
	header.Set("X-Accel-Buffering", "no") // tell nginx-like proxies not to buffer
	rr.w.WriteHeader(http.StatusOK)
	rr.started = true
}

// failureError is the failure a run's failure event reports: errUpstreamCancelled
// when the node cancelled the run; a *requestError (400
// invalid_request_error naming the field, if any) when the node could not
// translate or send the request; else an *upstreamError with the event's
// status and message.
func failureError(ev contract.Event) error {
	switch {
	case ev.Cancelled:
		return errUpstreamCancelled
	case ev.InvalidRequest:
		param := Clip(ev.Param)
		msg := ev.Message
		if param != "" {
			msg = strings.TrimPrefix(msg, param+": ")
		}
		return &requestError{param: param, message: msg}
	default:
		return &upstreamError{status: ev.Status, message: ev.Message}
	}
}

// tunnelQueue hands out a tunnel-path run's events one at a time, those
// of a head that carries the body, or all of it, in turn
// (contract.TunnelParts), for a reader that renders no writes of its own
// and needs no flush per message.
type tunnelQueue struct {
	parts [3]contract.Event
	i, n  int
}

// event returns the next event, reading the next message with recv when
// the last one's are used up; a message that is not a tunnel part (a
// normalized message on a tunnel run) is ErrUpstreamProtocol, recv's
// error is returned as it is.
func (q *tunnelQueue) event(recv func() (contract.Message, error)) (contract.Event, error) {
	if q.i == q.n {
		msg, err := recv()
		if err != nil {
			return contract.Event{}, err
		}
		if !msg.Tunnel {
			return contract.Event{}, ErrUpstreamProtocol
		}
		q.parts, q.n = contract.TunnelParts(msg)
		q.i = 0
	}
	q.i++
	return q.parts[q.i-1], nil
}
