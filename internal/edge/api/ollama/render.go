package ollama

import (
	"encoding/json"
	"net/http"
	"strings"

	"iop/internal/edge/api"
	"iop/internal/edge/api/httpconn"
	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// render renders a run as an Ollama /api/chat or /api/generate
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
type render struct {
	*api.Answer
	s       *server
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

var _ run = (*render)(nil)

// begin sets the run o renders, once it was dispatched (which ends the
// queue wait the final object reports as load_duration).
func (o *render) begin(a *api.Answer) {
	o.Answer, o.timings.Dispatched = a, o.s.f.Now()
}

// normalized renders a normalized-path run: its delta events (text, thinking and
// tool-call parts, joined by index), usage and end events (read by
// api.Answer.ReadEvents). It returns the rendering's reason.
func (o *render) normalized() string {
	var calls []translate.ToolCall // by index
	end, err := o.ReadEvents(func(ev *contract.Event) error {
		for _, tc := range ev.ToolCalls {
			i := tc.Index
			if i < 0 || i >= api.MaxToolCalls {
				return api.ErrUpstreamProtocol
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
	return o.finish(translate.Answer{Finish: end.Finish, ToolCalls: calls, Usage: &translate.Usage{
		PromptTokens: end.PromptTokens, CompletionTokens: end.CompletionTokens}})
}

// tunnel renders a tunnel-path run, the OpenAI-compatible provider's
// answer to the canonical body: a 2xx SSE stream is decoded as it arrives
// (translate.OpenAIStream; its reasoning_content or reasoning becomes
// thinking), a 2xx JSON body once complete (translate.DecodeOpenAIAnswer),
// and an error status becomes an error answer with that status and the
// provider's message. An error object inside a 200 stream fails the run
// (502, or a last error line). It returns the rendering's reason.
func (o *render) tunnel() string {
	onDelta := func(d translate.Delta) error {
		o.Content(1)
		if o.noThinking {
			d.Thinking = ""
		}
		if d.Text == "" && d.Thinking == "" {
			return nil
		}
		return o.onDelta(d, nil)
	}
	var stream translate.OpenAIStream
	sse, body, err := o.TunnelAnswer(func(data []byte) error { return stream.Feed(data, onDelta) })
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
		return o.failed(api.StreamError(err))
	}
	return o.finish(ans)
}

// onDelta takes one delta of text, thinking or both: streamed, it is
// written as one line at once (the status line first, once); else it is
// kept for the final object. Its arrival is the first token's, if none
// came before (thinking included: it is what a thinking model produces
// first). logprobs are the delta's tokens' log probabilities, on its line
// (streamed) or gathered for the final object. A write failure is an
// api.WriteFailure.
func (o *render) onDelta(d translate.Delta, logprobs []translate.OllamaLogprob) error {
	now := o.s.f.Now()
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
		return api.WriteFailure(err)
	}
	return nil
}

// startStream sends the status line and headers of an NDJSON answer, once.
func (o *render) startStream() { o.StartStreamAs(ndjsonContentType) }

// writeLine writes v as one NDJSON line and flushes it.
func (o *render) writeLine(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return o.Write(append(b, '\n'))
}

// finish writes the end of a complete answer: streamed, a line with the
// tool calls if there are any (chat), then the final object; else the one
// object with the whole text and tool calls. It returns the rendering's reason.
func (o *render) finish(ans translate.Answer) string {
	now := o.s.f.Now()
	o.timings.End = now
	var usage translate.Usage
	if ans.Usage != nil {
		usage = *ans.Usage
		o.Tokens(usage.PromptTokens, usage.CompletionTokens)
	}
	final := translate.NewOllamaResponse(o.chat, o.model, now, o.text.String())
	calls := translate.OllamaToolCalls(ans.ToolCalls)
	if !o.chat && len(calls) > 0 {
		o.s.f.Logger().Debug("dropping tool calls from a generate answer", "model", api.Clip(o.model))
		calls = nil
	}
	final.SetFinal(translate.OllamaDoneReason(ans.Finish), usage, o.timings)
	if o.conversation != nil {
		final.Context = translate.EncodeContext(append(o.conversation, translate.Turn{Role: "assistant", Content: o.answer.String()}))
	}
	if !o.stream {
		if httpconn.ClientGone(o.HTTPRequest()) {
			return api.ReasonClientGone
		}
		final.SetThinking(o.thinking.String())
		final.Logprobs = o.logprobs
		if len(calls) > 0 {
			final.Message.ToolCalls = calls
		}
		writeJSON(o.ResponseWriter(), http.StatusOK, final)
		return api.ReasonCompleted
	}
	o.startStream()
	if len(calls) > 0 {
		line := translate.NewOllamaResponse(true, o.model, now, "")
		line.Message.ToolCalls = calls
		if err := o.writeLine(line); err != nil {
			return o.WriteFailed(err)
		}
	}
	if err := o.writeLine(final); err != nil {
		return o.WriteFailed(err)
	}
	return api.ReasonCompleted
}

// failed ends a run that failed with err: before the status line, an
// Ollama error answer with api.Classify's status; after it, a last line
// {"error":"..."} and no done object (the JSON client libraries raise it
// as an error). A failed write to the client, or a client gone, aborts the
// connection instead. It returns the rendering's reason.
func (o *render) failed(err error) string {
	if reason, ended := o.FailedEarly(err); ended {
		return reason
	}
	o.AnswerFailed(err)
	e, msg := errorMessage(err, o.Request())
	o.LogStarted(e, err)
	o.ErrorCode(e.Code)
	if werr := o.writeLine(errorBody{Error: msg}); werr != nil {
		o.Abort()
		return api.ReasonWriteFailed
	}
	return api.ReasonUpstreamError
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
