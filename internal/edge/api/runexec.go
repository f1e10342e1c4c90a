package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"iop/internal/edge/contract"
	"iop/internal/runs"
	"iop/internal/sse"
)

// runChatPath is the path a run's chat request is logged under: a run is
// a chat completion (POST /v1/chat/completions) of the runs API.
const runChatPath = "/v1/chat/completions"

// runTarget is what a submitted run executes: the submission, the request
// id of its API request (the submission's), and the node and provider its
// session prefers ("" for none).
type runTarget struct {
	requestID                  string
	sub                        runSubmission
	preferNode, preferProvider string
}

// execute runs a submitted run: it dispatches the submission's chat
// completion request (Operation CHAT, streamed, usage included) with the
// run's id and its session's preference, and records the run's typed
// events (contract.Message) in the run as they arrive, rendered once as
// the chat.completion.chunk events a streaming client of the chat route
// gets (normalized path) or taken from the provider's SSE as it sent them
// (tunnel path, read with package sse). ctx ends when the run is
// cancelled. The chat request is an API request of operation "runs" named
// t.requestID: its outcome is decided once and is the run record's too
// (runRecorder.outcome). A refusal by the gateway (an unknown model, a
// full queue, ...) is sent on refused (buffered, one slot) before the run
// finishes, so that a synchronous submission answers it as the chat route
// does.
func (h *handler) execute(ctx context.Context, run *runs.Run, t runTarget, refused chan<- error) {
	// Its own observation: ctx carries the submitting request's values, and
	// that request may finish first.
	obs := &observation{now: h.cfg.Now}
	obs.rec.Start = obs.now()
	obs.rec.API, obs.rec.RequestID, obs.rec.Key = "runs", t.requestID, keyName(ctx)
	chat := t.sub.chat
	req := &contract.Request{
		Model:                chat.Model,
		Operation:            contract.OperationChat,
		Stream:               chat.Stream,
		Body:                 t.sub.chatBody,
		Needs:                chat.Needs,
		EstimatedInputTokens: chat.EstimatedInputTokens,
		Headers:              map[string]string{}, // a run forwards no client headers
	}
	_ = h.assignFlow(ctx, nil, req, obs) // no header: it cannot fail
	rc := &runRecorder{h: h, ctx: ctx, run: run, obs: obs, req: req}
	defer func() { h.finish(ctx, obs, rc.status) }()
	if err := chat.ollama.moveTo(req); err != nil {
		rc.answerError(err)
	} else {
		rc.dispatch(t, refused)
	}
	// The run's answer is finished (answerDone also ran before its last
	// event, unless the run never started).
	answerFinished(ctx)
	run.Finish(rc.outcome(obs.decide(rc.status)))
}

// runRecorder records the answer of one run of the runs API in its
// runs.Run: each event is appended to the run's log as `data: <payload>\n\n`
// with the output text it carries (a chat chunk's delta.content of choice
// 0), and the recorder keeps what the record says of the answer: its
// status, finish reason, usage (from its usage chunk) and error (an error
// event, or an error answer's message). Only the run's goroutine uses it.
type runRecorder struct {
	h   *handler
	ctx context.Context // the run's: it ends when the run is cancelled
	run *runs.Run
	obs *observation
	req *contract.Request

	// status is the answer's status once it has one: the head's (tunnel),
	// 200 once a normalized stream started, or an error answer's.
	status int
	// started is set once the answer has its status; sse says it is an
	// event stream, whose events are recorded as they come.
	started, sse bool
	body         []byte // a non-SSE body, up to maxErrorBody
	// done is set once the answer was marked finished (answerDone).
	done bool
	// abort is set when a started answer was cut short (logged only).
	abort bool

	errMsg, finishReason           string
	promptTokens, completionTokens int
}

// maxErrorBody caps the non-SSE body a runRecorder keeps.
const maxErrorBody = 64 << 10

// dispatch dispatches the run's request and records its answer by its
// execution path, as serveRunWith does for a client of the chat route.
// The run is closed exactly once before dispatch returns, with the
// request's outcome (observation.ended).
func (rc *runRecorder) dispatch(t runTarget, refused chan<- error) {
	h, obs := rc.h, rc.obs
	obs.request(rc.req)
	queued := h.cfg.Now()
	obs.dispatching(queued)
	rc.req.RunID = rc.run.Record().ID
	rc.req.PreferNodeID, rc.req.PreferProviderID = t.preferNode, t.preferProvider
	run, err := rc.gatewayDispatch(refused)
	if err != nil {
		if errors.Is(err, ErrQueueTimeout) {
			obs.queueWaited(h.cfg.Now().Sub(queued))
		}
		rc.answerError(err)
		return
	}
	info := run.Info()
	rc.run.Dispatched(runs.Record{
		NodeID: info.NodeID, ProviderID: info.ProviderID, ServedModel: info.ServedModel,
		Path: info.Path.String(), QueueReason: info.QueueReason.String(), QueueWait: info.QueueWait,
	})
	obs.dispatched(info)

	// A cancelled run ends its dispatched run at once (a blocked Recv
	// returns); the outcome is still decided here, from how the recording
	// ended.
	stop := context.AfterFunc(rc.ctx, func() { run.Cancel(ReasonClientGone) })
	reason := "" // a recording that panics ends the request "error"
	defer func() {
		stop()
		run.Close(obs.ended(reason))
	}()
	switch info.Path {
	case contract.PathTunnel:
		reason = rc.tunnel(run)
	case contract.PathNormalized:
		reason = rc.normalized(run, "chatcmpl-"+info.RunID, h.cfg.Now().Unix(), t.sub.chat.Model, t.sub.chat.IncludeUsage)
	default:
		reason = rc.fail(run, errUnknownPath)
	}
	if reason != ReasonCompleted && h.stopping() {
		reason = ReasonEdgeStopped // its run was ended by the edge's stop
	}
	h.logRunEnded(rc.ctx, info, rc.req, reason, rc.abort)
}

// gatewayDispatch is handler.dispatch for the run's request; a refusal by
// the gateway itself is also sent on refused.
func (rc *runRecorder) gatewayDispatch(refused chan<- error) (Run, error) {
	if err := checkModel(rc.ctx, rc.req.Model); err != nil {
		return nil, err
	}
	run, err := rc.h.gw.Dispatch(rc.ctx, *rc.req)
	if err != nil {
		refused <- err
		return nil, err
	}
	return run, nil
}

// recv is Answer.recv for a run: Run.Recv with its failures turned
// into outcomes, finishing the answer (answerDone) when the run ended at
// the edge, before anything of its end is recorded.
func (rc *runRecorder) recv(run Run) (contract.Message, error) {
	msg, err := run.Recv()
	if err != nil || msg.Ends {
		rc.answerDone(run)
	}
	if errors.Is(err, io.EOF) {
		return contract.Message{}, errUpstreamEnded
	}
	if err != nil {
		return contract.Message{}, fmt.Errorf("%w: %w", errUpstreamLost, err)
	}
	return msg, nil
}

// answerDone is Answer.answerDone: it ends the run at the edge if it
// has not ended and gives the key's request slot back. Idempotent.
func (rc *runRecorder) answerDone(run Run) {
	if rc.done {
		return
	}
	rc.done = true
	run.Cancel("the edge ended the answer")
	answerFinished(rc.ctx)
}

// gone reports whether the run was cancelled (its submitter left, a
// DELETE, the edge stopping): then nothing more is recorded.
func (rc *runRecorder) gone() bool { return rc.ctx.Err() != nil }

// answerError records an error answer for err, as writeError answers a
// client: the status and OpenAI error body classify maps err to; nothing
// when the run was cancelled.
func (rc *runRecorder) answerError(err error) {
	if rc.gone() {
		rc.h.logger.Debug("client gone before the answer", "path", runChatPath, "err", errorText(err, rc.req))
		rc.obs.failed(err, nil, true)
		return
	}
	e := Classify(err, rc.req)
	rc.obs.failed(err, e.Code, false)
	rc.h.logFailure(rc.ctx, runChatPath, e, err, rc.req)
	answerFinished(rc.ctx) // an error answer ends the request
	rc.status, rc.started = e.status, true
	body, merr := json.Marshal(errorBody{Error: e})
	if merr != nil { // only values of this package: a bug, not bad input
		rc.status, body = http.StatusInternalServerError, []byte(`{"error":{"message":"Internal server error","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	rc.body = body
}

// fail is Answer.fail: it ends an answer that failed before its
// status with an error answer (nothing if the run was cancelled) and
// returns the recording's reason.
func (rc *runRecorder) fail(run Run, err error) string {
	if rc.gone() {
		rc.h.logger.Debug("client gone", "path", runChatPath, "err", errorText(err, rc.req))
		return ReasonClientGone
	}
	rc.answerDone(run)
	rc.answerError(err)
	if errors.As(err, new(*requestError)) {
		return ReasonInvalidRequest
	}
	return ReasonUpstreamError
}

// failStarted is Answer.failStarted: an event stream ends with one
// error event (no [DONE]); any other answer is cut short.
func (rc *runRecorder) failStarted(run Run, err error) string {
	if rc.gone() {
		rc.h.logger.Debug("client gone", "path", runChatPath, "err", errorText(err, rc.req))
		rc.abort = true
		return ReasonClientGone
	}
	rc.answerDone(run)
	e := Classify(err, rc.req)
	rc.h.logFailure(rc.ctx, runChatPath, e, err, rc.req)
	rc.obs.errorCode(e.Code)
	if !rc.sse {
		rc.abort = true
		return ReasonUpstreamError
	}
	b, _ := json.Marshal(errorBody{Error: e})
	eb, _ := json.Marshal(e)
	rc.errMsg = errorMessage(eb)
	rc.append(b, "")
	return ReasonUpstreamError
}

// append adds one event whose data is payload, carrying text, to the
// run's log (sse.AppendEvent: one data line per line of payload, so that
// a reader of the log gets payload back whole).
func (rc *runRecorder) append(payload []byte, text string) {
	rc.run.Append(sse.AppendEvent(make([]byte, 0, len(payload)+8), "", payload), text)
}

// normalized records a normalized-path run as the chat route streams it
// (chatRender.stream, with include_usage): a first chunk with the
// assistant role, one chunk per delta's reasoning, text and tool-call
// parts, a final chunk with the finish reason, a usage chunk and
// `data: [DONE]`; a run that fails before its first delta gets an error
// answer, a later failure one error event. id, created and model are the
// chunks' (model: the name the run asked for). It returns the recording's
// reason.
func (rc *runRecorder) normalized(run Run, id string, created int64, model string, includeUsage bool) string {
	chunks := chunkRenderer{id: id, created: created, model: model,
		sink: func(data []byte, text string) error {
			rc.status, rc.started, rc.sse = http.StatusOK, true, true
			rc.append(data, text)
			return nil
		}}
	var used usage
	finish, err := func() (string, error) {
		for {
			msg, err := rc.recv(run)
			if err != nil {
				return "", err
			}
			if msg.Tunnel {
				return "", ErrUpstreamProtocol
			}
			for i := range msg.Events {
				ev := &msg.Events[i]
				switch ev.Kind {
				case contract.EventDelta: // the edge leaves out deltas without content
					rc.obs.content(1)
					if err := chunks.delta(ev); err != nil {
						return "", err
					}
				case contract.EventUsage:
					used = usageOf(ev)
					rc.obs.tokens(used.PromptTokens, used.CompletionTokens)
				case contract.EventEnd:
					if ev.FinishReason == "" {
						return "stop", nil
					}
					return ev.FinishReason, nil
				case contract.EventFailure:
					return "", failureError(*ev)
				}
			}
		}
	}()
	switch {
	case err != nil && !rc.started:
		return rc.fail(run, err)
	case err != nil:
		return rc.failStarted(run, err)
	}
	rc.finishReason = finish
	var u *usage
	if includeUsage {
		u = &used
		rc.promptTokens, rc.completionTokens = used.PromptTokens, used.CompletionTokens
	}
	_ = chunks.end(finish, u) // the sink does not fail
	rc.run.Append(sse.AppendDone(nil), "")
	return ReasonCompleted
}

// usageOf is the OpenAI usage object of a usage event.
func usageOf(ev *contract.Event) usage {
	return usage{PromptTokens: ev.PromptTokens, CompletionTokens: ev.CompletionTokens,
		TotalTokens: ev.PromptTokens + ev.CompletionTokens}
}

// tunnel records a tunnel-path run as Answer.tunnel relays it: the
// head gives the status and says whether the answer is an event stream;
// the body's bytes (OpenAI chat-completions bytes) are read once, by
// finalHold's reader, which tells the observation of each event as it is
// read and this recorder of each event once it is released
// (tunnelEvent): the events completed by the bytes that end the answer
// wait for the end event and are dropped if the run fails instead, as a
// client of the chat route never gets them. Any other body is kept, up to
// maxErrorBody, for its error message. It returns the recording's reason.
func (rc *runRecorder) tunnel(run Run) string {
	hold := finalHold{obs: rc.obs, runs: rc}
	var next tunnelQueue
	for {
		ev, err := next.event(func() (contract.Message, error) { return rc.recv(run) })
		if err != nil {
			return rc.tunnelFail(run, err)
		}
		switch ev.Kind {
		case contract.EventHead:
			if rc.started {
				return rc.tunnelFail(run, ErrUpstreamProtocol)
			}
			if ev.Status < 200 || ev.Status > 599 {
				return rc.fail(run, ErrUpstreamProtocol)
			}
			contentType := ""
			for name, value := range ev.Headers {
				if http.CanonicalHeaderKey(name) == "Content-Type" {
					contentType = value
				}
			}
			hold.sse = isEventStream(contentType)
			rc.status, rc.started, rc.sse = ev.Status, true, hold.sse
		case contract.EventData:
			if !rc.started {
				return rc.fail(run, ErrUpstreamProtocol)
			}
			rc.data(hold.split(ev.Data))
		case contract.EventEnd:
			if !rc.started {
				return rc.fail(run, errUpstreamEnded)
			}
			rc.data(hold.rest())
			if msg := ev.ProviderError; msg != "" {
				rc.h.logger.Warn("provider reported an error inside its answer", "path", runChatPath,
					"model", Clip(rc.req.Model), "err", clipTo(msg, maxErrorTextBytes))
				return ReasonUpstreamError
			}
			if rc.status >= 400 {
				return ReasonUpstreamError
			}
			return ReasonCompleted
		case contract.EventFailure:
			return rc.tunnelFail(run, failureError(ev))
		default:
			return rc.tunnelFail(run, ErrUpstreamProtocol)
		}
	}
}

// tunnelFail ends a tunnel-path recording that failed with err.
func (rc *runRecorder) tunnelFail(run Run, err error) string {
	if !rc.started {
		return rc.fail(run, err)
	}
	return rc.failStarted(run, err)
}

// data records the next released bytes of a tunnel answer's body: one
// that is not an event stream is kept, up to maxErrorBody, for its
// message (an event stream's events come through tunnelEvent).
func (rc *runRecorder) data(p []byte) {
	if rc.sse {
		return
	}
	if room := maxErrorBody - len(rc.body); room > 0 {
		rc.body = append(rc.body, p[:min(room, len(p))]...)
	}
}

// tunnelEvent records one released event of a tunnel stream, whose data
// is an OpenAI chat.completion.chunk, an error object or [DONE]: its
// choice 0's delta.content is output text, its finish_reason and error
// are kept, and its usage, as the stream's reader read it for the
// observation too (readStreamEvent).
func (rc *runRecorder) tunnelEvent(ev streamEvent) {
	payload, text := ev.data, ""
	if !ev.done {
		var chunk struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(payload, &chunk) == nil {
			for _, c := range chunk.Choices {
				if c.Index != 0 {
					continue
				}
				text += c.Delta.Content
				if c.FinishReason != "" {
					rc.finishReason = c.FinishReason
				}
			}
			if !isAbsent(chunk.Error) {
				rc.errMsg = errorMessage(chunk.Error)
			}
		}
	}
	if ev.hasUsage {
		rc.promptTokens, rc.completionTokens = ev.usage.PromptTokens, ev.usage.CompletionTokens
	}
	rc.append(payload, text)
}

// errorMessage is the message of an OpenAI error object, or its JSON.
func errorMessage(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return e.Message
	}
	return clipTo(string(raw), maxQuotedBytes)
}

// outcome is how the recorded answer ended; requestOutcome is the outcome
// decided for the run's chat request (an Outcome* value), which the record
// keeps and which decides a complete state: the run is complete exactly
// when its request completed.
func (rc *runRecorder) outcome(requestOutcome contract.Outcome) runs.Outcome {
	ctx := rc.ctx
	o := runs.Outcome{Status: rc.status, FinishReason: rc.finishReason, PromptTokens: rc.promptTokens,
		CompletionTokens: rc.completionTokens, Outcome: requestOutcome.String()}
	switch {
	case requestOutcome == contract.OutcomeCompleted:
		o.State = runs.StateComplete
	case errors.Is(context.Cause(ctx), runs.ErrStopping) || requestOutcome == contract.OutcomeEdgeStopped:
		o.State, o.Error = runs.StateError, runs.ErrStopping.Error()
		rc.appendError(o.Error, "edge_stopped")
	case ctx.Err() != nil:
		o.State = runs.StateCancelled
		o.Error = "cancelled: " + context.Cause(ctx).Error()
		rc.appendError(o.Error, "run_cancelled")
	case rc.errMsg != "":
		o.State, o.Error = runs.StateError, rc.errMsg
	case !rc.sse && rc.status >= 400:
		var body struct {
			Error json.RawMessage `json:"error"`
		}
		o.State, o.Error = runs.StateError, http.StatusText(rc.status)
		if json.Unmarshal(rc.body, &body) == nil && !isAbsent(body.Error) {
			o.Error = errorMessage(body.Error)
			rc.append(bytes.TrimSpace(rc.body), "")
		} else {
			rc.appendError(o.Error, "upstream_error")
		}
	default:
		o.State, o.Error = runs.StateError, errUpstreamEnded.Error()
		rc.appendError(o.Error, "upstream_error")
	}
	return o
}

// appendError ends the run's log with an OpenAI error event.
func (rc *runRecorder) appendError(message, code string) {
	b, _ := json.Marshal(errorBody{Error: newAPIError(0, "server_error", "", code, message)})
	rc.append(b, "")
}
