package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"

	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// ollamaRender renders a run as an Ollama /api/chat or /api/generate
// answer. Streamed (the client's "stream" absent or true): NDJSON
// (application/x-ndjson), one object per delta of text or thinking
// (message.thinking in a chat answer, thinking in a generate answer, as
// Ollama writes a thinking model's answer), written and flushed as it
// arrives, then a final object with done true, done_reason, counts and
// durations; the status line goes with the first delta, so a run that
// fails before any output gets an error answer with its own status, and
// one that fails later ends with a last line {"error":"..."} and no done
// object. Not streamed: one JSON object with the whole text and thinking.
// Only the request goroutine uses it.
type ollamaRender struct {
	*Answer
	chat    bool
	model   string // the model name the client asked for
	stream  bool
	timings translate.Timings
	// noThinking drops the reasoning of an OpenAI-compatible provider: the
	// client sent think false (translate.Request.NoThinking), and Ollama
	// then answers without thinking.
	noThinking bool
	// conversation is a non-raw generate request's conversation
	// (translate.Request.Conversation), nil otherwise: its final object
	// carries it with the answer's text as its "context".
	conversation []translate.Turn

	text, thinking strings.Builder           // the whole answer, when not streaming
	logprobs       []translate.OllamaLogprob // the whole answer's, when not streaming
	answer         strings.Builder           // the whole text, for the context
}

var _ ollamaRun = (*ollamaRender)(nil)

// begin sets the run o renders, once it was dispatched (which ends the
// queue wait the final object reports as load_duration).
func (o *ollamaRender) begin(rr *Answer) {
	o.Answer, o.timings.Dispatched = rr, rr.h.cfg.Now()
}

// normalized renders a normalized-path run: its delta events (text, thinking and
// tool-call parts, joined by index), usage and end events (read by
// eventReader.next). It returns the rendering's reason.
func (o *ollamaRender) normalized() string {
	er := &eventReader{Answer: o.Answer}
	var calls []translate.ToolCall // by index
	finish, err := er.next(func(ev *contract.Event) error {
		for _, tc := range ev.ToolCalls {
			i := tc.Index
			if i < 0 || i >= MaxToolCalls {
				return ErrUpstreamProtocol
			}
			for len(calls) <= i {
				calls = append(calls, translate.ToolCall{})
			}
			c := &calls[i]
			if tc.ID != "" {
				c.ID = tc.ID
			}
			if tc.Name != "" {
				c.Name = tc.Name
			}
			c.Arguments += tc.Arguments
		}
		if ev.Text != "" || ev.Thinking != "" || len(ev.Logprobs) > 0 {
			return o.onDelta(translate.Delta{Text: ev.Text, Thinking: ev.Thinking}, ollamaLogprobs(ev.Logprobs))
		}
		return nil
	})
	if err != nil {
		return o.failed(err)
	}
	return o.finish(translate.Answer{Finish: finish, ToolCalls: calls, Usage: &translate.Usage{
		PromptTokens: er.usage.PromptTokens, CompletionTokens: er.usage.CompletionTokens}})
}

// tunnel renders a tunnel-path run, the OpenAI-compatible provider's
// answer to the canonical body: a 2xx SSE stream is decoded as it arrives
// (translate.OpenAIStream; its reasoning_content or reasoning becomes
// thinking), a 2xx JSON body once complete (translate.DecodeOpenAIAnswer),
// and an error status becomes an error answer with that status and the
// provider's message. An error object inside a 200 stream fails the run
// (502, or a last error line). It returns the rendering's reason.
func (o *ollamaRender) tunnel() string {
	onDelta := func(d translate.Delta) error {
		o.obs.content(1)
		if o.noThinking {
			d.Thinking = ""
		}
		if d.Text == "" && d.Thinking == "" {
			return nil
		}
		return o.onDelta(d, nil)
	}
	var stream translate.OpenAIStream
	sse, body, err := o.tunnelAnswer(func(data []byte) error { return stream.Feed(data, onDelta) })
	if err != nil {
		return o.failed(err)
	}
	var ans translate.Answer
	if sse {
		ans, err = stream.End()
	} else if ans, err = translate.DecodeOpenAIAnswer(body); err == nil && (ans.Text != "" || ans.Thinking != "") {
		err = onDelta(translate.Delta{Text: ans.Text, Thinking: ans.Thinking})
	}
	if err != nil {
		return o.failed(streamError(err))
	}
	return o.finish(ans)
}

// tunnelAnswer reads a tunnel-path run to its end. A 2xx event stream is
// handed to onSSE as it arrives (sse is then true); with onSSE nil, or for
// any other 2xx answer, the body is returned whole. Errors: an
// *upstreamError with the provider's status and message for an error
// status or a tunnel failure, one of status 502 for a body over
// Config.MaxAnswerBytes, onSSE's error through streamError,
// ErrUpstreamProtocol or errUpstreamEnded for a run that breaks the
// tunnel's message order, and recv's errors.
func (rr *Answer) tunnelAnswer(onSSE func(data []byte) error) (sse bool, body []byte, err error) {
	status, retryAfter := 0, ""
	var next tunnelQueue
	for {
		ev, err := next.event(rr.recv)
		if err != nil {
			return false, nil, err
		}
		switch ev.Kind {
		case contract.EventHead:
			if status != 0 {
				return false, nil, ErrUpstreamProtocol
			}
			status = ev.Status
			if status < 200 || status > 599 {
				return false, nil, ErrUpstreamProtocol
			}
			for name, value := range ev.Headers {
				switch http.CanonicalHeaderKey(name) {
				case "Content-Type":
					sse = onSSE != nil && status < 300 && isEventStream(value)
				case "Retry-After":
					// The provider's, for the Ollama client as an OpenAI
					// client gets it.
					if _, err := strconv.Atoi(value); err == nil {
						retryAfter = value
					} else if _, err := http.ParseTime(value); err == nil {
						retryAfter = value
					}
				}
			}
		case contract.EventData:
			if status == 0 {
				return false, nil, ErrUpstreamProtocol
			}
			data := ev.Data
			if sse {
				if err := onSSE(data); err != nil {
					return false, nil, streamError(err)
				}
				continue
			}
			if int64(len(body)+len(data)) > rr.h.cfg.MaxAnswerBytes {
				return false, nil, &upstreamError{status: http.StatusBadGateway, message: "the provider's answer is too large"}
			}
			body = append(body, data...)
		case contract.EventEnd:
			if status == 0 {
				return false, nil, errUpstreamEnded
			}
			if status >= 300 {
				return false, nil, &upstreamError{status: status, message: clipTo(translate.DecodeOpenAIError(body), maxErrorTextBytes), retryAfter: retryAfter}
			}
			return sse, body, nil
		case contract.EventFailure:
			return false, nil, failureError(ev)
		default:
			return false, nil, ErrUpstreamProtocol
		}
	}
}

// streamError maps a decoding failure of a tunnel answer to this package's
// outcomes; a failed write to the client passes through.
func streamError(err error) error {
	var pe *translate.ProviderError
	switch {
	case errors.As(err, new(*errWrite)):
		return err
	case errors.As(err, &pe):
		return &upstreamError{status: http.StatusBadGateway, message: clipTo(pe.Error(), maxErrorTextBytes)}
	case errors.Is(err, translate.ErrStreamTruncated):
		return errUpstreamEnded
	default:
		return &upstreamError{status: http.StatusBadGateway, message: err.Error()}
	}
}

// onDelta takes one delta of text, thinking or both: streamed, it is
// written as one line at once (the status line first, once); else it is
// kept for the final object. Its arrival is the first token's, if none
// came before (thinking included: it is what a thinking model produces
// first). logprobs are the delta's tokens' log probabilities, on its line
// (streamed) or gathered for the final object. A write failure is an
// *errWrite.
func (o *ollamaRender) onDelta(d translate.Delta, logprobs []translate.OllamaLogprob) error {
	now := o.h.cfg.Now()
	if o.timings.FirstToken.IsZero() {
		o.timings.FirstToken = now
	}
	if o.conversation != nil {
		o.answer.WriteString(d.Text)
	}
	if !o.stream {
		o.text.WriteString(d.Text)
		o.thinking.WriteString(d.Thinking)
		o.logprobs = append(o.logprobs, logprobs...)
		return nil
	}
	o.startStream()
	line := translate.NewOllamaResponse(o.chat, o.model, now, d.Text)
	line.SetThinking(d.Thinking)
	line.Logprobs = logprobs
	if err := o.writeLine(line); err != nil {
		return &errWrite{err}
	}
	return nil
}

// startStream sends the status line and headers of an NDJSON answer, once.
func (o *ollamaRender) startStream() {
	if o.started {
		return
	}
	header := o.w.Header()
	header.Set("Content-Type", ndjsonContentType)
	header.Set("Cache-Control", "no-cache")
	header.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
	o.started = true
}

// writeLine writes v as one NDJSON line and flushes it.
func (o *ollamaRender) writeLine(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return o.write(append(b, '\n'))
}

// finish writes the end of a complete answer: streamed, a line with the
// tool calls if there are any (chat), then the final object; else the one
// object with the whole text and tool calls. It returns the rendering's reason.
func (o *ollamaRender) finish(ans translate.Answer) string {
	now := o.h.cfg.Now()
	o.timings.End = now
	var usage translate.Usage
	if ans.Usage != nil {
		usage = *ans.Usage
		o.obs.tokens(usage.PromptTokens, usage.CompletionTokens)
	}
	final := translate.NewOllamaResponse(o.chat, o.model, now, o.text.String())
	calls := translate.OllamaToolCalls(ans.ToolCalls)
	if !o.chat && len(calls) > 0 {
		o.h.logger.Debug("dropping tool calls from a generate answer", "model", Clip(o.model))
		calls = nil
	}
	final.SetFinal(translate.OllamaDoneReason(ans.Finish), usage, o.timings)
	if o.conversation != nil {
		final.Context = translate.EncodeContext(append(o.conversation, translate.Turn{Role: "assistant", Content: o.answer.String()}))
	}
	if !o.stream {
		if clientGone(o.r) {
			return ReasonClientGone
		}
		final.SetThinking(o.thinking.String())
		final.Logprobs = o.logprobs
		if len(calls) > 0 {
			final.Message.ToolCalls = calls
		}
		writeOllamaJSON(o.w, http.StatusOK, final)
		return ReasonCompleted
	}
	o.startStream()
	if len(calls) > 0 {
		line := translate.NewOllamaResponse(true, o.model, now, "")
		line.Message.ToolCalls = calls
		if err := o.writeLine(line); err != nil {
			return o.writeFailed(err)
		}
	}
	if err := o.writeLine(final); err != nil {
		return o.writeFailed(err)
	}
	return ReasonCompleted
}

// failed ends a run that failed with err: before the status line, an
// Ollama error answer with classify's status; after it, a last line
// {"error":"..."} and no done object (the JSON client libraries raise it
// as an error). A failed write to the client, or a client gone, aborts the
// connection instead. It returns the rendering's reason.
func (o *ollamaRender) failed(err error) string {
	if reason, ended := o.failedEarly(err); ended {
		return reason
	}
	o.answerFailed(err)
	e, msg := ollamaError(err, o.req)
	o.logStarted(e, err)
	o.obs.errorCode(e.Code)
	if werr := o.writeLine(ollamaErrorBody{Error: msg}); werr != nil {
		o.abort = true
		return ReasonWriteFailed
	}
	return ReasonUpstreamError
}

// ollamaLogprobs is a delta's log probabilities in Ollama's shape (nil for
// none).
func ollamaLogprobs(lps []contract.TokenLogprob) []translate.OllamaLogprob {
	if len(lps) == 0 {
		return nil
	}
	out := make([]translate.OllamaLogprob, len(lps))
	for i, lp := range lps {
		out[i] = translate.OllamaLogprob{Token: lp.Token, Logprob: lp.Logprob, TopLogprobs: ollamaLogprobs(lp.TopLogprobs)}
		if len(lp.Bytes) > 0 {
			out[i].Bytes = make([]int, len(lp.Bytes))
			for j, b := range lp.Bytes {
				out[i].Bytes[j] = int(b)
			}
		}
	}
	return out
}
