package anthropic

import (
	"errors"
	"net/http"

	"iop/internal/edge/api"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// messagesRender renders a run as a Messages API answer
// (translate.AnthropicAnswer builds it). Streamed ("stream": true):
// text/event-stream with Anthropic's events, each written and flushed as
// its part arrives; the status line and message_start (then a ping) go
// with the first part, the end, or the first messagesPingInterval of
// quiet (while the request waits for its dispatch too), so a run that
// fails before any of these gets an error answer with its own status, and
// one that fails later ends with `event: error` and no message_stop. Not streamed: one message
// object. Reasoning becomes a thinking block only when the request
// enabled thinking. Only the request goroutine uses it.
type messagesRender struct {
	*api.Answer
	stream   bool
	thinking bool // the request enabled thinking: show the reasoning
	ans      translate.AnthropicAnswer
	// pings, when streaming, is the run that pings a quiet stream
	// (pingRun); the renderer stops it before it returns.
	pings *pingRun
}

// newMessagesRender is the renderer of rr's answer to the request tr,
// made before rr has a run when the stream may start while the request
// waits (quiet): its message id is then "msg_" and the run id the request
// was dispatched with (contract.Request.RunID), until dispatched names the run.
func newMessagesRender(rr *api.Answer, tr translate.AnthropicRequest) *messagesRender {
	m := &messagesRender{Answer: rr, stream: tr.Stream, thinking: tr.Thinking}
	m.ans = translate.AnthropicAnswer{ID: "msg_" + rr.Request().RunID, Model: tr.Model,
		InputTokens: tr.EstimatedInputTokens, OneToolCall: tr.OneToolCall}
	if m.stream {
		m.ans.Write = func(p []byte) error {
			if err := m.Write(p); err != nil {
				return api.WriteFailure(err)
			}
			return nil
		}
	}
	return m
}

// dispatched takes the run rr got: the message is named after it unless
// message_start was sent already (a retried run's id differs from the
// request's by its "-retry" suffix), and a stream's run pings while it is
// quiet (pingRun).
func (m *messagesRender) dispatched(info contract.DispatchInfo) *messagesRender {
	if !m.Started() {
		m.ans.ID = "msg_" + info.RunID
	}
	if m.stream {
		m.pings = newPingRun(m.Run(), messagesPingInterval, m.quiet)
		m.SetRun(m.pings)
	} else {
		_ = m.ans.Start() // collects only
	}
	return m
}

// quiet is called when the stream was quiet for messagesPingInterval,
// before the dispatch returned too (dispatchQuiet): it sends a ping, or
// the stream's start (message_start and its ping) if nothing was sent
// yet; a failure after that ends the stream with an error event rather
// than an error status.
func (m *messagesRender) quiet() error {
	if !m.Started() {
		return m.begin()
	}
	return m.ans.Ping()
}

// end stops the pings, before the renderer returns its reason.
func (m *messagesRender) end(reason string) string {
	if m.pings != nil {
		m.pings.stop()
	}
	return reason
}

// begin sends the stream's status line, headers and message_start, once.
func (m *messagesRender) begin() error {
	if !m.stream || m.Started() {
		return nil
	}
	m.StartStream()
	return m.ans.Start()
}

// part adds one part of the answer (reasoning, text, tool-call parts).
func (m *messagesRender) part(thinking, text string, calls []contract.ToolCallPart) error {
	if !m.thinking {
		thinking = ""
	}
	if thinking == "" && text == "" && len(calls) == 0 {
		return nil
	}
	if err := m.begin(); err != nil {
		return err
	}
	if err := m.ans.Thinking(thinking); err != nil {
		return answerError(err)
	}
	if err := m.ans.Text(text); err != nil {
		return answerError(err)
	}
	for _, c := range calls {
		if c.Index < 0 || c.Index >= api.MaxToolCalls {
			return api.ErrUpstreamProtocol
		}
		if err := m.ans.ToolCall(c.Index, c.ID, c.Name, c.Arguments); err != nil {
			return answerError(err)
		}
	}
	return nil
}

// answerError is the failure of an answer the provider broke so that it
// cannot be a Messages answer (translate.ErrMalformedAnswer: a tool call's
// part after its block closed, arguments that are not a JSON object): a
// 502 saying what was broken, which a stream ends with as its error event.
// A failed write passes through.
func answerError(err error) error {
	if errors.Is(err, translate.ErrMalformedAnswer) && !api.IsWriteFailure(err) {
		return api.UpstreamFailure(http.StatusBadGateway, err.Error())
	}
	return err
}

// normalized renders a normalized-path run from its run events.
func (m *messagesRender) normalized() (reason string) {
	defer func() { reason = m.end(reason) }()
	end, err := m.ReadEvents(func(ev *contract.Event) error {
		return m.part(ev.Thinking, ev.Text, ev.ToolCalls)
	})
	if err != nil {
		return m.failed(err)
	}
	m.ans.StopSequence = end.StopSequence
	return m.finish(end.Finish, &translate.Usage{PromptTokens: end.PromptTokens, CompletionTokens: end.CompletionTokens})
}

// tunnel renders a tunnel-path run, the OpenAI-compatible provider's
// answer to the canonical body: a 2xx SSE stream decoded as it arrives
// (translate.OpenAIStream: text, reasoning and tool-call parts as they
// come, each tool-call part as an input_json_delta), a 2xx JSON body
// once complete (translate.DecodeOpenAIAnswer), an error status as an
// error answer with that status and the provider's message.
//
// message_start's usage.input_tokens is the provider's prompt count when
// its stream reported one before the first part (providerInput), else the
// edge's estimate (the request's EstimatedInputTokens), as on the
// normalized path, where Ollama counts the prompt only in its last line;
// message_delta's usage carries the provider's count either way, as
// Anthropic's streams may revise usage there.
func (m *messagesRender) tunnel() (reason string) {
	defer func() { reason = m.end(reason) }()
	var stream translate.OpenAIStream
	onDelta := func(d translate.Delta) error {
		m.Content(1)
		m.providerInput(stream.Usage())
		return m.part(d.Thinking, d.Text, nil)
	}
	stream.ToolDelta = func(index int, id, name, args string) error {
		m.Content(1)
		m.providerInput(stream.Usage())
		return m.part("", "", []contract.ToolCallPart{{Index: index, ID: id, Name: name, Arguments: args}})
	}
	sse, body, err := m.TunnelAnswer(func(data []byte) error { return stream.Feed(data, onDelta) })
	if err != nil {
		return m.failed(err)
	}
	var ans translate.Answer
	if sse {
		ans, err = stream.End()
	} else if ans, err = translate.DecodeOpenAIAnswer(body); err == nil {
		err = onDelta(translate.Delta{Text: ans.Text, Thinking: ans.Thinking})
	}
	if err == nil && !sse {
		calls := make([]contract.ToolCallPart, 0, len(ans.ToolCalls))
		for i, c := range ans.ToolCalls {
			calls = append(calls, contract.ToolCallPart{Index: i, ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
		err = m.part("", "", calls)
	}
	if err != nil {
		if api.IsWriteFailure(err) {
			return m.failed(err)
		}
		return m.failed(api.StreamError(err))
	}
	if ans.Usage != nil {
		m.Tokens(ans.Usage.PromptTokens, ans.Usage.CompletionTokens)
	}
	m.ans.StopSequence = ans.StopSequence
	return m.finish(ans.Finish, ans.Usage)
}

// providerInput makes the provider's prompt count, when u has one, the
// input_tokens of message_start, if it was not sent yet.
func (m *messagesRender) providerInput(u *translate.Usage) {
	if !m.Started() && u != nil && u.PromptTokens > 0 {
		m.ans.InputTokens = u.PromptTokens
	}
}

// finish ends a complete answer: streamed, the last block's end,
// message_delta and message_stop; else the one message object.
func (m *messagesRender) finish(finish string, usage *translate.Usage) string {
	if err := m.begin(); err != nil {
		return m.failed(err)
	}
	if err := m.ans.Finish(finish, usage); err != nil {
		return m.failed(answerError(err))
	}
	if m.stream {
		return api.ReasonCompleted
	}
	if m.HTTPRequest().Context().Err() != nil {
		return api.ReasonClientGone
	}
	httpconn.WriteJSON(m.ResponseWriter(), http.StatusOK, m.ans.Message())
	return api.ReasonCompleted
}

// failed ends a run that failed with err: before the status line, an
// Anthropic error answer with its status; after it, `event: error` with
// Anthropic's error body and no message_stop. A failed write to the
// client, or a client gone, aborts the connection instead.
func (m *messagesRender) failed(err error) string {
	if reason, ended := m.FailedEarly(err); ended {
		return reason
	}
	m.AnswerFailed(err)
	e, _, typ := anthropicError(err, m.Request())
	m.LogStarted(e, err)
	m.ErrorCode(e.Code)
	if werr := m.Write(translate.AnthropicEvent("error", translate.NewAnthropicError(typ, e.Message))); werr != nil {
		m.Abort()
		return api.ReasonWriteFailed
	}
	return api.ReasonUpstreamError
}
