package responses

import (
	"context"
	"log/slog"
	"net/http"

	"iop/internal/edge/api"
	"iop/internal/edge/api/access"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/contract"
	"iop/internal/sse"
	"iop/internal/translate"
)

// responsesRender renders a run as a Responses API answer (OpenAI API
// reference, "Responses" and "Streaming events"). The run's reasoning,
// text and tool-call parts go through a translate.ResponseBuilder, which
// makes the output items (reasoning with a summary_text, a message with
// an output_text, function_call items) and, streamed, their events.
//
// Streamed: an SSE stream of "event: <type>" / "data: <json>" events,
// each with its sequence_number: response.created and
// response.in_progress with the first output (so a run that fails before
// any output gets an error answer with its own status), the items'
// events, then response.completed (or response.incomplete when the answer
// was cut by max_output_tokens or a content filter) with the whole
// response and its usage. A run that fails after the stream began ends
// with response.failed (status "failed", its error), never with a
// clean-looking completed. Not streamed: one response object.
//
// A stored response (save set) is kept before the final event or the
// body is written, so a client that continues it at once finds it, and
// the key's request slot (max_concurrent) is given back only once the
// save is done (Answer.keepSlot). A save that fails fails the
// request: not streamed, a 500 error answer; streamed, response.failed
// with the error, never response.completed (a client told "store": true
// must find what it was told is stored). Only the request goroutine (a
// background response's run goroutine) uses it.
type responsesRender struct {
	*api.Answer
	logger *slog.Logger
	resp   *responseObject
	stream bool
	// background: the run is a background response's (its state is
	// saved as it goes).
	background bool
	// save keeps the response; nil when it is not stored.
	save  func(ctx context.Context, resp *responseObject) error
	saved bool // a final state was saved
	// created is set once a streamed response was stored in_progress, at
	// response.created.
	created bool

	// noThinking drops the answer's reasoning: the client asked for
	// reasoning.effort "none" (translate.ResponsesRequest.NoThinking).
	noThinking bool

	// log records a background response's answer in its run; nil for
	// the others.
	log *responseRunLog
	// finishReason is the run's finish reason, once it completed.
	finishReason string

	// reasoningTokens is the provider's completion_tokens_details.
	// reasoning_tokens (tunnel path); 0 when it reported none, and on the
	// normalized path, whose run events carry no such count.
	reasoningTokens int
	// reasoningChars counts the bytes of reasoning put in the output's
	// reasoning items, for the estimate of reasoningTokensOf.
	reasoningChars int

	// events is a background response's event log: its events go
	// there, not to a connection (emit); nil for the others.
	events *responseEventLog

	b      translate.ResponseBuilder
	opened bool // the stream's response.created was written
}

// finalEvents are the events that end a Responses stream.
var finalEvents = map[string]bool{"response.completed": true, "response.incomplete": true, "response.failed": true}

// endEvents ends a background response's event log once its run is over,
// if its rendering wrote no final event: response.failed for a response
// that failed before its answer began, an "error" event (code
// response_cancelled) for a cancelled one.
func (o *responsesRender) endEvents() {
	if o.events == nil || o.events.ended() {
		return
	}
	if o.resp.Status == "failed" {
		_ = o.b.Event("response.failed", map[string]any{"response": o.resp})
		return
	}
	_ = o.b.Event("error", map[string]any{"code": "response_cancelled", "message": "The response was cancelled.", "param": nil})
}

// begin sets the run o renders, once it was dispatched.
func (o *responsesRender) begin(rr *api.Answer) {
	o.Answer = rr
	if o.save != nil {
		rr.KeepSlot()
	}
	o.b.NewID = newItemID
	if o.stream {
		o.b.Emit = o.emit
	}
}

// inProgress saves a background response as "in_progress" once it was
// dispatched.
func (o *responsesRender) inProgress(info contract.DispatchInfo) {
	if o.log != nil {
		o.log.dispatched(info)
	}
	o.resp.Status = "in_progress"
	if o.save != nil {
		if err := o.save(o.HTTPRequest().Context(), o.resp); err != nil {
			o.logger.Warn("saving a background response failed", "response_id", o.resp.ID, "err", err)
		}
	}
	if o.events != nil {
		snap := *o.resp
		_ = o.b.Event("response.in_progress", map[string]any{"response": &snap})
	}
}

// store saves the response in its current (final) state, then gives the
// key's request slot back (answerFinished; the run has ended). A failure
// is logged and returned as an *errNotStored.
func (o *responsesRender) store(ctx context.Context) error {
	if o.save == nil {
		return nil
	}
	defer access.AnswerFinished(ctx)
	if err := o.saveNow(ctx); err != nil {
		return err
	}
	o.saved = true
	return nil
}

// saveNow saves the response in its current state (bounded by
// responsesStoreTimeout, also when ctx has ended). A failure is logged and
// returned as an *errNotStored.
func (o *responsesRender) saveNow(ctx context.Context) error {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), responsesStoreTimeout)
	defer cancel()
	if err := o.save(sctx, o.resp); err != nil {
		o.logger.Warn("saving a response failed", "response_id", o.resp.ID, "err", err)
		return &errNotStored{err}
	}
	return nil
}

// errNotStored is a stored response's save that failed. It does not
// unwrap (classify makes it a 500 internal_error whatever the cause, a
// timeout included: the client's request did not time out).
type errNotStored struct{ err error }

func (e *errNotStored) Error() string { return "the response could not be stored: " + e.err.Error() }

// msgNotStored is the error message of a streamed response whose save
// failed.
const msgNotStored = "The response could not be stored; it was not kept. Retry the request."

// open starts a streamed answer, once: a stored response is saved
// in_progress first (so GET and DELETE find it once its id is out; a
// failed save is an error answer), then the SSE headers,
// response.created and response.in_progress.
func (o *responsesRender) open() error {
	if !o.stream || o.opened {
		return nil
	}
	if o.events != nil {
		// A background response: response.created went to its log when
		// it was created, response.in_progress when it was dispatched.
		o.opened = true
		o.StartStream()
		return nil
	}
	if o.save != nil && !o.created {
		if err := o.saveNow(o.HTTPRequest().Context()); err != nil {
			return err
		}
		o.created = true
	}
	o.opened = true
	o.StartStream()
	snap := *o.resp
	snap.Status, snap.Output = "in_progress", []translate.ResponseItem{}
	if err := o.b.Event("response.created", map[string]any{"response": &snap}); err != nil {
		return err
	}
	return o.b.Event("response.in_progress", map[string]any{"response": &snap})
}

// emit writes one event (the builder's Emit). A write failure is an
// *errWrite.
func (o *responsesRender) emit(ev translate.ResponseEvent) error {
	// A fresh buffer: the event log keeps it.
	buf := sse.AppendEvent(make([]byte, 0, len(ev.Type)+len(ev.Data)+16), ev.Type, ev.Data)
	if o.events != nil {
		o.events.add(buf, finalEvents[ev.Type] || ev.Type == "error")
		return nil
	}
	if err := o.Write(buf); err != nil {
		return api.WriteFailure(err)
	}
	return nil
}

func (o *responsesRender) thinking(s string) error {
	if s == "" || o.noThinking {
		return nil
	}
	if err := o.open(); err != nil {
		return err
	}
	if o.log != nil {
		o.log.thinking(s)
	}
	o.reasoningChars += len(s)
	return o.b.Thinking(s)
}

func (o *responsesRender) text(s string) error {
	if s == "" {
		return nil
	}
	if err := o.open(); err != nil {
		return err
	}
	if o.log != nil {
		o.log.text(s)
	}
	return o.b.Text(s)
}

func (o *responsesRender) toolCall(index int, id, name, args string) error {
	if index < 0 || index >= api.MaxToolCalls {
		return api.ErrUpstreamProtocol
	}
	if err := o.open(); err != nil {
		return err
	}
	if o.log != nil {
		o.log.toolCall(index, id, name, args)
	}
	return o.b.ToolCall(index, id, name, args)
}

// normalized renders a normalized-path run from its delta, usage and end
// events (Answer.ReadEvents).
func (o *responsesRender) normalized() string {
	end, err := o.ReadEvents(func(ev *contract.Event) error {
		if err := o.thinking(ev.Thinking); err != nil {
			return err
		}
		if err := o.text(ev.Text); err != nil {
			return err
		}
		for _, tc := range ev.ToolCalls {
			if err := o.toolCall(tc.Index, tc.ID, tc.Name, tc.Arguments); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return o.failed(err)
	}
	return o.finish(end.Finish, end.PromptTokens, end.CompletionTokens)
}

// tunnel renders a tunnel-path run, the OpenAI-compatible provider's
// answer to the canonical chat body: a 2xx SSE stream decoded as it
// arrives (translate.OpenAIStream, tool-call deltas included), a 2xx JSON
// body once complete (translate.DecodeOpenAIAnswer); an error status is an
// error answer with that status and the provider's message.
func (o *responsesRender) tunnel() string {
	var stream translate.OpenAIStream
	stream.ToolDelta = func(index int, id, name, args string) error {
		o.Content(1)
		return o.toolCall(index, id, name, args)
	}
	onDelta := func(d translate.Delta) error {
		o.Content(1)
		if err := o.thinking(d.Thinking); err != nil {
			return err
		}
		return o.text(d.Text)
	}
	sse, body, err := o.TunnelAnswer(func(data []byte) error { return stream.Feed(data, onDelta) })
	if err != nil {
		return o.failed(err)
	}
	var ans translate.Answer
	if sse {
		ans, err = stream.End()
	} else if ans, err = translate.DecodeOpenAIAnswer(body); err == nil {
		err = onDelta(translate.Delta{Text: ans.Text, Thinking: ans.Thinking})
		for i, tc := range ans.ToolCalls {
			if err == nil {
				err = o.toolCall(i, tc.ID, tc.Name, tc.Arguments)
			}
		}
	}
	if err != nil {
		return o.failed(api.StreamError(err))
	}
	in, out := 0, 0
	if ans.Usage != nil {
		in, out = ans.Usage.PromptTokens, ans.Usage.CompletionTokens
		o.Tokens(in, out)
		o.reasoningTokens = ans.Usage.ReasoningTokens
	}
	return o.finish(ans.Finish, in, out)
}

// reasoningTokensOf is the usage's output_tokens_details.reasoning_tokens
// of an answer of out output tokens: the provider's count when it gave
// one (an OpenAI-compatible provider's completion_tokens_details), else,
// when the output has a reasoning item, an estimate: its reasoning's
// bytes / 4 rounded up (the measure of every estimate of the edge), at
// most out when out is known; 0 without reasoning.
func (o *responsesRender) reasoningTokensOf(out int) int {
	if o.reasoningTokens > 0 || o.reasoningChars == 0 {
		return o.reasoningTokens
	}
	n := (o.reasoningChars + 3) / 4
	if out > 0 {
		n = min(n, out)
	}
	return n
}

// finish ends a complete answer: its items done, the response completed
// (or incomplete) with its usage, stored, then written: the final event,
// or the one object. It returns the rendering's reason.
func (o *responsesRender) finish(finishReason string, in, out int) string {
	status, reason := translate.ResponseStatus(finishReason)
	o.finishReason = finishReason
	if err := o.open(); err != nil {
		return o.failed(err)
	}
	if err := o.b.Finish(status); err != nil {
		return o.failed(err)
	}
	o.resp.Status, o.resp.Output, o.resp.Usage = status, o.b.Output(), newResponseUsage(in, out)
	o.resp.Usage.OutputTokensDetails.ReasoningTokens = o.reasoningTokensOf(out)
	if reason != "" {
		o.resp.IncompleteDetails = &incompleteDetails{Reason: reason}
	}
	if err := o.store(o.HTTPRequest().Context()); err != nil {
		return o.notStored(err)
	}
	if !o.stream {
		if httpconn.ClientGone(o.HTTPRequest()) {
			return api.ReasonClientGone
		}
		httpconn.WriteJSON(o.ResponseWriter(), http.StatusOK, o.resp)
		return api.ReasonCompleted
	}
	typ := "response.completed"
	if status == "incomplete" {
		typ = "response.incomplete"
	}
	if err := o.b.Event(typ, map[string]any{"response": o.resp}); err != nil {
		return o.WriteFailed(err)
	}
	return api.ReasonCompleted
}

// failed ends a run that failed with err: before the stream began (or
// not streamed), an error answer with classify's status; after it, the
// response is "failed" with the error, stored, and the stream ends with
// response.failed. A failed write to the client, or a client gone,
// aborts the connection instead. It returns the rendering's reason.
func (o *responsesRender) failed(err error) string {
	if reason, ended := o.FailedEarly(err); ended {
		return reason
	}
	o.AnswerFailed(err)
	e := api.Classify(err, o.Request())
	o.LogStarted(e, err)
	o.ErrorCode(e.Code)
	code := "server_error"
	if e.Status() < 500 && e.Code != nil {
		code = *e.Code
	}
	o.resp.Status, o.resp.Output = "failed", o.b.Output()
	o.resp.Error = &responseError{Code: code, Message: e.Message}
	_ = o.store(o.HTTPRequest().Context()) // failed either way; the error is logged
	if werr := o.b.Event("response.failed", map[string]any{"response": o.resp}); werr != nil {
		o.Abort()
		return api.ReasonWriteFailed
	}
	return api.ReasonUpstreamError
}

// notStored ends a complete answer whose save failed (err, an
// *errNotStored): not streamed, a 500 error answer; streamed, the
// response "failed" with server_error and response.failed. A client
// gone aborts instead. It returns the rendering's reason.
func (o *responsesRender) notStored(err error) string {
	if !o.stream {
		return o.Fail(err)
	}
	if httpconn.ClientGone(o.HTTPRequest()) {
		o.Abort()
		return api.ReasonClientGone
	}
	o.LogStarted(api.Classify(err, o.Request()), err)
	o.resp.Status, o.resp.Usage = "failed", nil
	o.resp.Error = &responseError{Code: "server_error", Message: msgNotStored}
	if werr := o.b.Event("response.failed", map[string]any{"response": o.resp}); werr != nil {
		o.Abort()
		return api.ReasonWriteFailed
	}
	return api.ReasonUpstreamError
}
