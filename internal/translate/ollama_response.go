package translate

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
)

// OllamaResponse is one object of an Ollama /api/chat or /api/generate
// answer (Ollama API doc): a streamed line, the final line (Done), or the
// whole non-streamed answer. A chat answer has Message, a generate answer
// Response; exactly one is set (see NewOllamaResponse). Durations are in
// nanoseconds and set on the final object only, as Ollama does.
type OllamaResponse struct {
	Model     string         `json:"model"`
	CreatedAt string         `json:"created_at"` // RFC 3339 with nanoseconds, UTC
	Message   *OllamaMessage `json:"message,omitempty"`
	Response  *string        `json:"response,omitempty"`
	// Thinking is a generate answer's reasoning text (GenerateResponse's
	// "thinking"); a chat answer's is Message.Thinking.
	Thinking string `json:"thinking,omitempty"`
	Done     bool   `json:"done"`
	// DoneReason is "stop", "length", "load" or "unload" (final object only).
	DoneReason string `json:"done_reason,omitempty"`
	// Context is a non-raw generate answer's conversation so far (final
	// object only), iop's encoding of it (EncodeContext) where Ollama
	// gives token ids; a client may send it back in its next request.
	Context            []int `json:"context,omitempty"`
	TotalDuration      int64 `json:"total_duration,omitempty"`
	LoadDuration       int64 `json:"load_duration,omitempty"`
	PromptEvalCount    int   `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64 `json:"prompt_eval_duration,omitempty"`
	EvalCount          int   `json:"eval_count,omitempty"`
	EvalDuration       int64 `json:"eval_duration,omitempty"`
	// Logprobs are the log probabilities of this object's tokens (all of
	// them in a whole answer), when asked for.
	Logprobs []OllamaLogprob `json:"logprobs,omitempty"`
}

// OllamaLogprob is one token's log probability in Ollama's shape
// (api.Logprob and api.TokenLogprob): bytes as an array of integers.
type OllamaLogprob struct {
	Token       string          `json:"token"`
	Logprob     float64         `json:"logprob"`
	Bytes       []int           `json:"bytes,omitempty"`
	TopLogprobs []OllamaLogprob `json:"top_logprobs,omitempty"`
}

// OllamaMessage is the assistant message of a chat answer.
type OllamaMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
	// Thinking is the reasoning text (Ollama's api.Message "thinking").
	Thinking  string           `json:"thinking,omitempty"`
	ToolCalls []OllamaToolCall `json:"tool_calls,omitempty"`
}

// OllamaToolCall is one function call in Ollama's shape: arguments are a
// JSON object, not text.
type OllamaToolCall struct {
	Function OllamaFunctionCall `json:"function"`
}

// OllamaFunctionCall is the function of an OllamaToolCall.
type OllamaFunctionCall struct {
	Name string `json:"name"`
	// Arguments is the provider's arguments text when it is a JSON object,
	// else that text as a JSON string (a model can emit broken JSON; the
	// client then sees what it sent).
	Arguments json.RawMessage `json:"arguments"`
}

// NewOllamaResponse returns a not-done object for model at time at, holding
// text as the assistant message (chat) or the response (generate).
func NewOllamaResponse(chat bool, model string, at time.Time, text string) OllamaResponse {
	r := OllamaResponse{Model: model, CreatedAt: at.UTC().Format(time.RFC3339Nano)}
	if chat {
		r.Message = &OllamaMessage{Role: "assistant", Content: text}
	} else {
		r.Response = &text
	}
	return r
}

// SetThinking sets the object's reasoning text where Ollama puts it: in
// the message of a chat answer, at the top of a generate answer.
func (r *OllamaResponse) SetThinking(thinking string) {
	if r.Message != nil {
		r.Message.Thinking = thinking
		return
	}
	r.Thinking = thinking
}

// OllamaToolCalls converts an answer's tool calls to Ollama's shape.
func OllamaToolCalls(calls []ToolCall) []OllamaToolCall {
	out := make([]OllamaToolCall, 0, len(calls))
	for _, c := range calls {
		args := json.RawMessage(strings.TrimSpace(c.Arguments))
		switch {
		case len(args) == 0:
			args = json.RawMessage(`{}`)
		case args[0] != '{' || !json.Valid(args):
			args, _ = json.Marshal(c.Arguments) // a string cannot fail
		}
		out = append(out, OllamaToolCall{Function: OllamaFunctionCall{Name: c.Name, Arguments: args}})
	}
	return out
}

// ArgumentsText is an Ollama tool call's arguments as OpenAI's JSON text:
// an object (Ollama's form) compacted, a JSON string taken as the text
// itself (OpenAI's form), absent or null as "{}". Arguments that are not
// JSON come back as they are, trimmed.
func ArgumentsText(raw json.RawMessage) string {
	text, _ := argumentsText(raw)
	return text
}

// argumentsText is ArgumentsText, also reporting whether raw was JSON.
func argumentsText(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "{}", true
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return string(bytes.TrimSpace(raw)), false
	}
	return buf.String(), true
}

// OllamaDoneReason maps an OpenAI finish_reason to Ollama's done_reason:
// "length" stays, anything else (stop, tool_calls, content_filter) is
// "stop".
func OllamaDoneReason(finish string) string {
	if finish == "length" {
		return "length"
	}
	return "stop"
}

// Timings are the moments of one run the edge measures, for the durations
// of a final object.
type Timings struct {
	// Start is when the request arrived; Dispatched when a provider took
	// it (after the queue); FirstToken when the first text or reasoning
	// arrived (zero if none did: a reasoning model's first token is its
	// reasoning); End when the answer was complete.
	Start, Dispatched, FirstToken, End time.Time
}

// SetFinal marks r as the final object with the done reason, counts and
// durations: total_duration = End-Start; load_duration = Dispatched-Start
// (the queue and dispatch: the time before a model started on the request,
// which is what Ollama's model loading is to its client); prompt_eval_duration
// = FirstToken-Dispatched; eval_duration = End-FirstToken. Each duration is
// at least 1 ns, so a client computing tokens per second from it never
// divides by zero.
func (r *OllamaResponse) SetFinal(doneReason string, usage Usage, t Timings) {
	first := t.FirstToken
	if first.IsZero() {
		first = t.End
	}
	r.Done, r.DoneReason = true, doneReason
	r.TotalDuration = max(int64(t.End.Sub(t.Start)), 1)
	r.LoadDuration = max(int64(t.Dispatched.Sub(t.Start)), 1)
	r.PromptEvalCount, r.PromptEvalDuration = usage.PromptTokens, max(int64(first.Sub(t.Dispatched)), 1)
	r.EvalCount, r.EvalDuration = usage.CompletionTokens, max(int64(t.End.Sub(first)), 1)
}
