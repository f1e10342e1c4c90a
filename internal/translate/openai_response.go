package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"iop/internal/sse"
)

// Errors of the OpenAI answer decoders.
var (
	// ErrStreamTruncated: the stream ended before a finish_reason or
	// "data: [DONE]".
	ErrStreamTruncated = errors.New("the provider's stream ended before the answer was complete")
	// ErrMalformedAnswer: an event or body is not an OpenAI completion
	// object.
	ErrMalformedAnswer = errors.New("the provider sent a malformed answer")
)

// ProviderError is an error object the provider sent inside an answer it
// began with a 2xx status: in an SSE event (`data: {"error":{...}}`) or as
// a whole body. Message is the provider's text; the caller scrubs nothing
// more (the node already redacted the provider's address and key on the
// tunnel path only for error statuses, so callers must not assume it).
type ProviderError struct {
	Message string
	// Code is the error object's "code" or "type" when it is a string.
	Code string
}

func (e *ProviderError) Error() string {
	if e.Message == "" {
		return "the provider reported an error"
	}
	return e.Message
}

// Usage is a token count the provider reported. ReasoningTokens is its
// usage.completion_tokens_details.reasoning_tokens (part of
// CompletionTokens), 0 when it reported none.
type Usage struct {
	PromptTokens, CompletionTokens int
	ReasoningTokens                int
}

// ToolCall is one complete function call of an answer.
type ToolCall struct {
	ID, Name string
	// Arguments is the call's arguments as the provider sent them: JSON
	// text, normally an object.
	Arguments string
}

// Answer is what an OpenAI chat completion or text completion answered,
// streamed or not: its text, reasoning, tool calls, finish reason and
// usage.
type Answer struct {
	Text string
	// Thinking is the reasoning text the provider sent apart from the
	// answer (Thinking of each Delta; see Delta).
	Thinking  string
	ToolCalls []ToolCall
	// Finish is choices[0].finish_reason: "stop", "length", "tool_calls",
	// "content_filter", ...; "" if none was sent.
	Finish string
	// StopSequence is the stop sequence that ended the answer, when the
	// provider said which (vLLM's choices[0].stop_reason, when a string:
	// the matched stop string; an integer, a stop token id, or null is
	// none); "" otherwise.
	StopSequence string
	// Usage is nil when the provider reported none.
	Usage *Usage
}

// Delta is one event's part of choice 0 of a streamed answer: its text
// and its reasoning text, either of which may be empty.
type Delta struct {
	Text string
	// Thinking is the delta's (or a whole answer's message's) reasoning
	// text: "reasoning_content" (vLLM, DeepSeek, LiteLLM) or, when that is
	// absent or empty, "reasoning" (Ollama's OpenAI API, OpenRouter, newer
	// vLLM). Servers that send both send the same text twice, so only one
	// is read.
	Thinking string
}

// openAIObject is the part of a chat.completion, chat.completion.chunk or
// text_completion object (OpenAI API reference) the decoders read, plus
// an "error" member some providers put in a 200 stream.
type openAIObject struct {
	Choices []struct {
		Index   int            `json:"index"`
		Text    *string        `json:"text"`    // text_completion
		Delta   *openAIContent `json:"delta"`   // chunk
		Message *openAIContent `json:"message"` // chat.completion
		// FinishReason is null until the choice's last chunk.
		FinishReason *string `json:"finish_reason"`
		// StopReason is vLLM's: the matched stop string, a stop token id
		// or null (stopSequence).
		StopReason json.RawMessage `json:"stop_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens            int `json:"prompt_tokens"`
		CompletionTokens        int `json:"completion_tokens"`
		CompletionTokensDetails *struct {
			ReasoningTokens int `json:"reasoning_tokens"`
		} `json:"completion_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// usage is obj's usage (non-nil) as a Usage.
func (obj *openAIObject) usage() *Usage {
	u := &Usage{PromptTokens: obj.Usage.PromptTokens, CompletionTokens: obj.Usage.CompletionTokens}
	if d := obj.Usage.CompletionTokensDetails; d != nil {
		u.ReasoningTokens = d.ReasoningTokens
	}
	return u
}

type openAIContent struct {
	Content *string `json:"content"`
	// ReasoningContent and Reasoning are the reasoning text under its two
	// names in the wild; raw, so that a provider's non-string value (an
	// object, in some APIs) is ignored rather than failing the event.
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ToolCalls        []struct {
		Index    *int   `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// thinking is the reasoning text of c: reasoning_content when it is a
// non-empty string, else reasoning when it is a string.
func (c *openAIContent) thinking() string {
	var s string
	if json.Unmarshal(c.ReasoningContent, &s) == nil && s != "" {
		return s
	}
	if json.Unmarshal(c.Reasoning, &s) == nil {
		return s
	}
	return ""
}

// OpenAIStream decodes an OpenAI chat.completion.chunk or text_completion
// SSE stream (OpenAI API reference, "Streaming"), fed in chunks of any size
// (package sse does the framing, by the WHATWG rules). Only choice 0 is
// read: translated requests never ask for more. Text and reasoning deltas
// are handed to the caller as they arrive; tool-call deltas (by their
// index, id, name and partial arguments) are joined; the finish reason and
// a usage chunk (whose "choices" is empty) are kept. "data: [DONE]" ends
// the stream; events after it are ignored. The zero value is ready to
// use, by one goroutine at a time.
type OpenAIStream struct {
	// ToolDelta, when set, gets each tool-call delta of choice 0 as it
	// arrives (its index, and the id, name and piece of arguments it
	// carries, each possibly empty), after the delta's text and
	// reasoning; its error ends Feed. The calls are joined for End all
	// the same.
	ToolDelta func(index int, id, name, arguments string) error

	sse    sse.Reader
	answer Answer
	calls  map[int]*ToolCall
	order  []int // tool-call indexes in order of first appearance
	done   bool  // [DONE] seen
}

// Feed reads the next bytes of the body, calling onDelta with each delta
// of choice 0 that has text or reasoning, in order. It returns onDelta's
// error, a *ProviderError for an event holding an "error" member,
// ErrMalformedAnswer for an event that is not JSON, or sse.ErrTooLong.
func (s *OpenAIStream) Feed(p []byte, onDelta func(Delta) error) error {
	return s.sse.Feed(p, func(e sse.Event) error { return s.event(e.Data, onDelta) })
}

// Usage is the usage the stream reported so far (the last "usage" member
// of its events), nil before any. A server that counts the prompt before
// it answers (vLLM's continuous usage stats) reports it with the first
// event.
func (s *OpenAIStream) Usage() *Usage { return s.answer.Usage }

// End ends the stream (the body is complete) and returns the answer
// without its text and reasoning (the caller collected those from
// onDelta). A last event not ended by a blank line is discarded, as the
// SSE rules say; End returns ErrStreamTruncated when neither a finish
// reason nor "[DONE]" arrived.
func (s *OpenAIStream) End() (Answer, error) {
	s.sse.End()
	if !s.done && s.answer.Finish == "" {
		return Answer{}, ErrStreamTruncated
	}
	return s.result(), nil
}

func (s *OpenAIStream) result() Answer {
	a := s.answer
	for _, i := range s.order {
		a.ToolCalls = append(a.ToolCalls, *s.calls[i])
	}
	return a
}

func (s *OpenAIStream) event(data []byte, onDelta func(Delta) error) error {
	if s.done {
		return nil
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		s.done = true
		return nil
	}
	var obj openAIObject
	if err := json.Unmarshal(data, &obj); err != nil {
		return fmt.Errorf("%w: an event is not a JSON object", ErrMalformedAnswer)
	}
	if err := providerError(obj.Error); err != nil {
		return err
	}
	if obj.Usage != nil {
		s.answer.Usage = obj.usage()
	}
	for _, c := range obj.Choices {
		if c.Index != 0 {
			continue
		}
		var d Delta
		if c.Text != nil {
			d.Text = *c.Text
		}
		if c.Delta != nil {
			if c.Delta.Content != nil {
				d.Text = *c.Delta.Content
			}
			d.Thinking = c.Delta.thinking()
		}
		if d.Text != "" || d.Thinking != "" {
			if err := onDelta(d); err != nil {
				return err
			}
		}
		if c.Delta != nil {
			for j, tc := range c.Delta.ToolCalls {
				idx := j
				if tc.Index != nil {
					idx = *tc.Index
				}
				s.addToolDelta(idx, tc.ID, tc.Function.Name, tc.Function.Arguments)
				if s.ToolDelta != nil {
					if err := s.ToolDelta(idx, tc.ID, tc.Function.Name, tc.Function.Arguments); err != nil {
						return err
					}
				}
			}
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			s.answer.Finish = *c.FinishReason
			s.answer.StopSequence = stopSequence(c.StopReason)
		}
	}
	return nil
}

// addToolDelta joins one streamed tool-call delta into the call at index:
// the id and name are set by the first delta that has them; arguments are
// appended.
func (s *OpenAIStream) addToolDelta(index int, id, name, args string) {
	if s.calls == nil {
		s.calls = make(map[int]*ToolCall)
	}
	tc := s.calls[index]
	if tc == nil {
		tc = &ToolCall{}
		s.calls[index] = tc
		s.order = append(s.order, index)
	}
	if tc.ID == "" {
		tc.ID = id
	}
	if tc.Name == "" {
		tc.Name = name
	}
	tc.Arguments += args
}

// DecodeOpenAIAnswer decodes a whole (not streamed) chat.completion or
// text_completion body. Errors: a *ProviderError for a body holding an
// "error" member, ErrMalformedAnswer for anything else that is not one
// with at least one choice.
func DecodeOpenAIAnswer(body []byte) (Answer, error) {
	var obj openAIObject
	if err := json.Unmarshal(body, &obj); err != nil {
		return Answer{}, fmt.Errorf("%w: the body is not a JSON object", ErrMalformedAnswer)
	}
	if err := providerError(obj.Error); err != nil {
		return Answer{}, err
	}
	var a Answer
	if obj.Usage != nil {
		a.Usage = obj.usage()
	}
	sort.SliceStable(obj.Choices, func(i, j int) bool { return obj.Choices[i].Index < obj.Choices[j].Index })
	if len(obj.Choices) == 0 {
		return Answer{}, fmt.Errorf("%w: no choices", ErrMalformedAnswer)
	}
	c := obj.Choices[0]
	switch {
	case c.Message != nil:
		if c.Message.Content != nil {
			a.Text = *c.Message.Content
		}
		a.Thinking = c.Message.thinking()
		for _, tc := range c.Message.ToolCalls {
			a.ToolCalls = append(a.ToolCalls, ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
	case c.Text != nil:
		a.Text = *c.Text
	}
	if c.FinishReason != nil {
		a.Finish = *c.FinishReason
		a.StopSequence = stopSequence(c.StopReason)
	}
	return a, nil
}

// stopSequence is a choice's stop_reason as a stop sequence: the string
// when it is a non-empty JSON string, else "" (absent, null, or a stop
// token id).
func stopSequence(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// DecodeOpenAIError returns the message of an OpenAI error body
// ({"error":{"message",...}}, {"error":"..."} or {"message":"..."}), or ""
// when body has none.
func DecodeOpenAIError(body []byte) string {
	var obj struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(body, &obj) != nil {
		return ""
	}
	if pe, ok := providerError(obj.Error).(*ProviderError); ok && pe != nil {
		return pe.Message
	}
	return strings.TrimSpace(obj.Message)
}

// providerError reads an "error" member: nil when absent or null, else a
// *ProviderError with its message (an object's "message", or the string
// itself).
func providerError(raw json.RawMessage) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return &ProviderError{Message: s}
	}
	var obj struct {
		Message string          `json:"message"`
		Code    json.RawMessage `json:"code"`
		Type    string          `json:"type"`
	}
	_ = json.Unmarshal(raw, &obj)
	e := &ProviderError{Message: obj.Message, Code: obj.Type}
	var code string
	if json.Unmarshal(obj.Code, &code) == nil && code != "" {
		e.Code = code
	}
	return e
}
