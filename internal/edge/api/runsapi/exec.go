package runsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"iop/internal/edge/api"
	"iop/internal/edge/api/stream"
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
// completion request (Operation chat, streamed, usage included, no client
// headers) with the run's id and its session's preference, as a detached
// request of operation "runs" named t.requestID (api.Frame.ServeDetached),
// and records its answer in the run (runRecorder): the chat.completion.chunk
// events a streaming client of the chat route gets, rendered once by the
// frame's chunk renderer (normalized path) or read from the provider's SSE
// as the frame relays it (tunnel path). ctx ends when the run is cancelled.
// The request's outcome is the run record's too (runRecorder.outcome). A
// refusal by the gateway (an unknown model, a full queue, ...) is sent on
// refused (buffered, one slot) before the run finishes, so that a
// synchronous submission answers it as the chat route does.
func (s *server) execute(ctx context.Context, run *runs.Run, t runTarget, refused chan<- error) {
	req := t.sub.chat
	req.Headers = map[string]string{} // a run forwards no client headers
	req.RunID = run.Record().ID
	req.PreferNodeID, req.PreferProviderID = t.preferNode, t.preferProvider
	rc := &runRecorder{run: run}
	dispatched := false
	d := s.f.ServeDetached(ctx, t.requestID, "runs", runChatPath, &req, api.Renderer{
		WriteError: func(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
			if !dispatched {
				select {
				case refused <- err:
				default:
				}
			}
			s.f.WriteError(w, r, err, req)
		},
		Tunnel: func(a *api.Answer, info contract.DispatchInfo) string {
			dispatched = true
			rc.dispatched(info)
			reason := a.RelayRecorded(rc.tunnelEvent)
			rc.sse = sse.IsEventStream(a.ResponseWriter().Header().Get("Content-Type"))
			return reason
		},
		Normalized: func(a *api.Answer, info contract.DispatchInfo) string {
			dispatched = true
			rc.dispatched(info)
			return rc.normalized(a, "chatcmpl-"+info.RunID, s.f.Now().Unix(), t.sub.chat.Model)
		},
	})
	// The run's answer is finished (also when it never started).
	api.AnswerFinished(ctx)
	run.Finish(rc.outcome(ctx, d))
}

// runRecorder records the answer of one run of the runs API in its
// runs.Run: each event is appended to the run's log as `data: <payload>\n\n`
// with the output text it carries (a chat chunk's delta.content of choice
// 0), and the recorder keeps what the record says of the answer: its
// finish reason, usage (from its usage chunk) and error (an error event).
// Only the run's goroutine uses it.
type runRecorder struct {
	run *runs.Run
	// sse says the answer is an event stream, whose events are recorded
	// as they come.
	sse bool

	errMsg, finishReason           string
	promptTokens, completionTokens int
}

// dispatched records where the run went.
func (rc *runRecorder) dispatched(info contract.DispatchInfo) {
	rc.run.Dispatched(runs.Record{
		NodeID: info.NodeID, ProviderID: info.ProviderID, ServedModel: info.ServedModel,
		Path: info.Path.String(), QueueReason: info.QueueReason.String(), QueueWait: info.QueueWait,
	})
}

// append adds one event whose data is payload, carrying text, to the
// run's log (sse.AppendEvent: one data line per line of payload, so that
// a reader of the log gets payload back whole).
func (rc *runRecorder) append(payload []byte, text string) {
	rc.run.Append(sse.AppendEvent(make([]byte, 0, len(payload)+8), "", payload), text)
}

// normalized records a normalized-path run as the chat route streams it
// (with include_usage), through the frame's chunk renderer
// (stream.ChatChunks): a first chunk with the assistant role, one chunk per
// delta's reasoning, text and tool-call parts, a final chunk with the
// finish reason, a usage chunk and `data: [DONE]`; a run that fails
// before its first delta gets an error answer, a later failure one error
// event. id, created and model are the chunks' (model: the name the run
// asked for). It returns the recording's reason.
func (rc *runRecorder) normalized(a *api.Answer, id string, created int64, model string) string {
	chunks := stream.NewChatChunks(id, created, model, func(data []byte, text string) error {
		a.StartStream()
		rc.sse = true
		rc.append(data, text)
		return nil
	})
	ev, err := a.ReadEvents(chunks.Delta)
	if err != nil {
		return rc.failed(a, err)
	}
	rc.finishReason = ev.Finish
	rc.promptTokens, rc.completionTokens = ev.PromptTokens, ev.CompletionTokens
	_ = chunks.End(ev.Finish, ev.PromptTokens, ev.CompletionTokens) // the sink does not fail
	rc.run.Append(sse.AppendDone(nil), "")
	return api.ReasonCompleted
}

// failed ends a normalized-path recording that failed with err: before
// its first event, an error answer (api.Answer.FailedEarly); after it,
// one error event (no [DONE]).
func (rc *runRecorder) failed(a *api.Answer, err error) string {
	if reason, ended := a.FailedEarly(err); ended {
		return reason
	}
	a.AnswerFailed(err)
	e := api.Classify(err, a.Request())
	a.LogStarted(e, err)
	a.ErrorCode(e.Code)
	b, _ := json.Marshal(errorBody{Error: e})
	rc.tunnelEvent(stream.Event{Data: b})
	return api.ReasonUpstreamError
}

// errorBody is the OpenAI error shape, {"error":{...}}.
type errorBody struct {
	Error *api.APIError `json:"error"`
}

// tunnelEvent records one event of the answer's stream as a client of
// the chat route reads it (api.Answer.RelayRecorded), whose data is an
// OpenAI chat.completion.chunk, an error object or [DONE]: its choice 0's
// delta.content is output text, its finish_reason and error are kept,
// and its usage, as the stream's reader read it.
func (rc *runRecorder) tunnelEvent(ev stream.Event) {
	payload, text := ev.Data, ""
	if !ev.Done {
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
	if ev.HasUsage {
		rc.promptTokens, rc.completionTokens = ev.PromptTokens, ev.CompletionTokens
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
	return api.Clip(string(raw))
}

// outcome is how the recorded answer ended, from d, how its request
// ended: d.Outcome (an Outcome value) is the request's outcome, which the
// record keeps and which decides a complete state: the run is complete
// exactly when its request completed. ctx is the run's.
func (rc *runRecorder) outcome(ctx context.Context, d api.Detached) runs.Outcome {
	o := runs.Outcome{Status: d.Status, FinishReason: rc.finishReason, PromptTokens: rc.promptTokens,
		CompletionTokens: rc.completionTokens, Outcome: d.Outcome}
	switch {
	case d.Outcome == contract.OutcomeCompleted.String():
		o.State = runs.StateComplete
	case errors.Is(context.Cause(ctx), runs.ErrStopping) || d.Outcome == contract.OutcomeEdgeStopped.String():
		o.State, o.Error = runs.StateError, runs.ErrStopping.Error()
		rc.appendError(o.Error, "edge_stopped")
	case ctx.Err() != nil:
		o.State = runs.StateCancelled
		o.Error = "cancelled: " + context.Cause(ctx).Error()
		rc.appendError(o.Error, "run_cancelled")
	case rc.errMsg != "":
		o.State, o.Error = runs.StateError, rc.errMsg
	case !rc.sse && d.Status >= 400:
		var body struct {
			Error json.RawMessage `json:"error"`
		}
		o.State, o.Error = runs.StateError, http.StatusText(d.Status)
		if json.Unmarshal(d.ErrorBody, &body) == nil && !isAbsent(body.Error) {
			o.Error = errorMessage(body.Error)
			rc.append(bytes.TrimSpace(d.ErrorBody), "")
		} else {
			rc.appendError(o.Error, "upstream_error")
		}
	default:
		o.State, o.Error = runs.StateError, api.ErrUpstreamEnded.Error()
		rc.appendError(o.Error, "upstream_error")
	}
	return o
}

// appendError ends the run's log with an OpenAI error event.
func (rc *runRecorder) appendError(message, code string) {
	rc.append(api.ErrorJSON("server_error", code, message), "")
}
