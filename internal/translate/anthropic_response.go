package translate

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"hash"
	"strings"
)

// This file builds the answer of Anthropic's Messages API (Anthropic API
// reference, "Messages" and "Streaming Messages") from the parts of an
// OpenAI-shaped answer: text, reasoning and tool-call deltas, a finish
// reason and usage, whichever execution path they came by.

// AnthropicUsage is a message's "usage", in tokens.
type AnthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// AnthropicMessage is a Messages API answer, {"type": "message"}.
type AnthropicMessage struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"` // "message"
	Role         string           `json:"role"` // "assistant"
	Model        string           `json:"model"`
	Content      []AnthropicBlock `json:"content"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        AnthropicUsage   `json:"usage"`
}

// AnthropicBlock is one content block of an answer: "text" {text},
// "thinking" {thinking, signature} or "tool_use" {id, name, input}.
type AnthropicBlock struct {
	Type      string
	Text      string // text, or thinking's reasoning
	Signature string // thinking
	ID, Name  string // tool_use
	// Arguments is a tool_use's input as JSON text, as the provider sent it.
	Arguments string
}

// MarshalJSON writes the block in its type's shape; a tool_use's input is
// its arguments, {} when they are empty (AnthropicAnswer refuses any that
// are not a JSON object: checkToolInput).
func (b AnthropicBlock) MarshalJSON() ([]byte, error) {
	switch b.Type {
	case "thinking":
		return json.Marshal(struct {
			Type      string `json:"type"`
			Thinking  string `json:"thinking"`
			Signature string `json:"signature"`
		}{b.Type, b.Text, b.Signature})
	case "tool_use":
		return json.Marshal(struct {
			Type  string          `json:"type"`
			ID    string          `json:"id"`
			Name  string          `json:"name"`
			Input json.RawMessage `json:"input"`
		}{b.Type, b.ID, b.Name, toolInput(b.Arguments)})
	default:
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{b.Type, b.Text})
	}
}

// toolInput is a tool call's arguments as an input object: {} when they
// are empty or not a JSON object.
func toolInput(args string) json.RawMessage {
	raw := json.RawMessage(strings.TrimSpace(args))
	if firstByte(raw) != '{' || !json.Valid(raw) {
		return json.RawMessage(`{}`)
	}
	return raw
}

// checkToolInput is ErrMalformedAnswer for a tool_use block whose
// arguments are neither empty (a call without arguments: input {}) nor a
// JSON object, which a tool_use's input must be (Anthropic API reference,
// "Messages": input is an object) and a client parses: such an answer
// is the provider's broken answer, not one to repair by dropping its
// arguments. The message quotes the arguments (at most 256 bytes).
func checkToolInput(b AnthropicBlock) error {
	args := strings.TrimSpace(b.Arguments)
	if args == "" || args[0] == '{' && json.Valid([]byte(args)) {
		return nil
	}
	return fmt.Errorf("%w: the arguments of tool call %q are not a JSON object: %s", ErrMalformedAnswer, clip(b.Name), clip(args))
}

// AnthropicStopReason maps an OpenAI finish reason to a Messages API
// stop_reason: "length" is max_tokens, "tool_calls" (or an answer with a
// tool call, as Ollama ends one with "stop") tool_use, "content_filter"
// refusal, "stop" with a matched stop sequence (stopSequence, as the node
// or an OpenAI-compatible provider's stop_reason said) stop_sequence,
// anything else end_turn.
func AnthropicStopReason(finish string, toolUse bool, stopSequence string) string {
	switch {
	case toolUse || finish == "tool_calls" || finish == "function_call":
		return "tool_use"
	case finish == "length":
		return "max_tokens"
	case finish == "content_filter":
		return "refusal"
	case finish == "stop" && stopSequence != "":
		return "stop_sequence"
	}
	return "end_turn"
}

// AnthropicAnswer builds one Messages API answer from an answer's parts,
// in the order they arrive: Thinking, Text and ToolCall open a content
// block of their kind when the open one is of another (closing it), and
// Finish ends the message. With Write set the answer streams: each event
// is handed to Write as it happens, "event: <type>\ndata: <json>\n\n"
// (message_start and a ping on Start; content_block_start, text_delta,
// thinking_delta, input_json_delta, signature_delta and content_block_stop
// as blocks open, grow and close; message_delta with stop_reason and usage
// and message_stop on Finish). Message returns the whole message either
// way. Only one goroutine uses it.
type AnthropicAnswer struct {
	// ID is the message id ("msg_..."), Model the model the client asked
	// for.
	ID, Model string
	// InputTokens is the estimate message_start reports and the usage
	// falls back to when the provider reported none.
	InputTokens int
	// OneToolCall keeps the first tool call only
	// (tool_choice.disable_parallel_tool_use).
	OneToolCall bool
	// Write, when set, receives each streamed event.
	Write func(event []byte) error
	// StopSequence, set before Finish, is the request's stop sequence
	// that ended the answer ("" when none did or it is not known): with
	// finish "stop" it is the message's stop_sequence, and stop_reason is
	// "stop_sequence".
	StopSequence string

	blocks   []AnthropicBlock
	open     int         // index of the open block; -1 when none
	tools    map[int]int // a provider tool-call index -> its block
	keptTool int         // with OneToolCall: the provider index kept, -1 before the first
	sig      hash.Hash   // of the open thinking block's text
	started  bool
	message  AnthropicMessage
}

// Start begins the answer: streamed, message_start and one ping. It is
// called once, before any part.
func (a *AnthropicAnswer) Start() error {
	a.open, a.keptTool, a.started = -1, -1, true
	a.tools = make(map[int]int)
	a.message = AnthropicMessage{ID: a.ID, Type: "message", Role: "assistant", Model: a.Model,
		Content: []AnthropicBlock{}, Usage: AnthropicUsage{InputTokens: a.InputTokens}}
	if err := a.emit("message_start", struct {
		Type    string           `json:"type"`
		Message AnthropicMessage `json:"message"`
	}{"message_start", a.message}); err != nil {
		return err
	}
	return a.Ping()
}

// Ping sends a ping event (streamed only): Anthropic's keep-alive, which
// clients ignore.
func (a *AnthropicAnswer) Ping() error {
	return a.emit("ping", map[string]string{"type": "ping"})
}

// Thinking adds reasoning text to the answer's thinking block.
func (a *AnthropicAnswer) Thinking(s string) error {
	if s == "" {
		return nil
	}
	if err := a.ensure("thinking"); err != nil {
		return err
	}
	a.blocks[a.open].Text += s
	a.sig.Write([]byte(s))
	return a.delta(blockDelta{Type: "thinking_delta", Thinking: &s})
}

// Text adds text to the answer's text block.
func (a *AnthropicAnswer) Text(s string) error {
	if s == "" {
		return nil
	}
	if err := a.ensure("text"); err != nil {
		return err
	}
	a.blocks[a.open].Text += s
	return a.delta(blockDelta{Type: "text_delta", Text: &s})
}

// ToolCall adds one part of the tool call at the provider's index: its id
// and name come with its first part (a block opens), its arguments (JSON
// text) in pieces, streamed as input_json_delta. The block's id is
// Anthropic-shaped: "toolu_" and the provider's id (its "call_" prefix
// dropped), or the message's id and the index when the provider gave
// none. A part of a call whose block was already closed by another block
// is ErrMalformedAnswer (streamed; joined otherwise).
func (a *AnthropicAnswer) ToolCall(index int, id, name, args string) error {
	if a.OneToolCall {
		if a.keptTool == -1 {
			a.keptTool = index
		}
		if index != a.keptTool {
			return nil
		}
	}
	b, ok := a.tools[index]
	switch {
	case !ok:
		if err := a.openBlock(AnthropicBlock{Type: "tool_use", ID: a.toolID(index, id), Name: name}); err != nil {
			return err
		}
		b = a.open
		a.tools[index] = b
	case b != a.open && a.Write != nil:
		return fmt.Errorf("%w: a tool call's part came after another block", ErrMalformedAnswer)
	}
	blk := &a.blocks[b]
	if blk.Name == "" {
		blk.Name = name
	}
	if args == "" {
		return nil
	}
	blk.Arguments += args
	if b != a.open {
		return nil
	}
	return a.delta(blockDelta{Type: "input_json_delta", PartialJSON: &args})
}

// toolID is the id of a tool_use block: Anthropic's ids are
// "toolu_[A-Za-z0-9_-]+".
func (a *AnthropicAnswer) toolID(index int, id string) string {
	if strings.HasPrefix(id, "toolu_") {
		return sanitizeID(id)
	}
	if id = strings.TrimPrefix(id, "call_"); id == "" {
		id = fmt.Sprintf("%s_%d", strings.TrimPrefix(a.ID, "msg_"), index)
	}
	return "toolu_" + sanitizeID(id)
}

func sanitizeID(id string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			return r
		}
		return '_'
	}, id)
}

// Finish ends the answer with the provider's finish reason and usage (nil:
// none reported; the output is then counted as 0 and the input as
// InputTokens): the open block is closed and, streamed, message_delta
// and message_stop are sent. A tool call whose arguments are not a JSON
// object is ErrMalformedAnswer (checkToolInput), streamed before its
// block's content_block_stop, else here: nothing more is sent.
func (a *AnthropicAnswer) Finish(finish string, usage *Usage) error {
	if err := a.closeOpen(); err != nil {
		return err
	}
	toolUse := false
	for _, b := range a.blocks {
		if b.Type == "tool_use" {
			toolUse = true
			if err := checkToolInput(b); err != nil {
				return err
			}
		}
	}
	reason := AnthropicStopReason(finish, toolUse, a.StopSequence)
	var stopSeq *string
	if reason == "stop_sequence" {
		seq := a.StopSequence
		stopSeq = &seq
	}
	u := AnthropicUsage{InputTokens: a.InputTokens}
	if usage != nil {
		u.OutputTokens = usage.CompletionTokens
		if usage.PromptTokens > 0 {
			u.InputTokens = usage.PromptTokens
		}
	}
	a.message.Content = append([]AnthropicBlock{}, a.blocks...)
	a.message.StopReason, a.message.StopSequence, a.message.Usage = &reason, stopSeq, u
	if err := a.emit("message_delta", struct {
		Type  string `json:"type"`
		Delta struct {
			StopReason   string  `json:"stop_reason"`
			StopSequence *string `json:"stop_sequence"`
		} `json:"delta"`
		Usage AnthropicUsage `json:"usage"`
	}{Type: "message_delta", Delta: struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}{StopReason: reason, StopSequence: stopSeq}, Usage: u}); err != nil {
		return err
	}
	return a.emit("message_stop", map[string]string{"type": "message_stop"})
}

// Message is the whole answer, once Finish was called.
func (a *AnthropicAnswer) Message() AnthropicMessage { return a.message }

// ensure makes the open block one of typ (text or thinking).
func (a *AnthropicAnswer) ensure(typ string) error {
	if a.open >= 0 && a.blocks[a.open].Type == typ {
		return nil
	}
	return a.openBlock(AnthropicBlock{Type: typ})
}

// openBlock closes the open block and opens b: content_block_start with
// b's empty form.
func (a *AnthropicAnswer) openBlock(b AnthropicBlock) error {
	if err := a.closeOpen(); err != nil {
		return err
	}
	a.blocks = append(a.blocks, b)
	a.open = len(a.blocks) - 1
	if b.Type == "thinking" {
		a.sig = sha256.New()
	}
	return a.emit("content_block_start", struct {
		Type         string         `json:"type"`
		Index        int            `json:"index"`
		ContentBlock AnthropicBlock `json:"content_block"`
	}{"content_block_start", a.open, b})
}

// closeOpen closes the open block, if any: a thinking block first gets
// its signature (signature_delta), an opaque value iop derives from the
// text (the SHA-256 of the reasoning, base64): clients keep it and send it
// back, and iop does not check it. Streamed, a tool_use block whose
// arguments are not a JSON object is not closed: ErrMalformedAnswer
// (checkToolInput; not streamed, a closed block may still get parts, and
// Finish checks it).
func (a *AnthropicAnswer) closeOpen() error {
	if a.open < 0 {
		return nil
	}
	i := a.open
	if a.blocks[i].Type == "tool_use" && a.Write != nil {
		if err := checkToolInput(a.blocks[i]); err != nil {
			return err
		}
	}
	if a.blocks[i].Type == "thinking" {
		sig := base64.StdEncoding.EncodeToString(a.sig.Sum(nil))
		a.blocks[i].Signature = sig
		if err := a.delta(blockDelta{Type: "signature_delta", Signature: &sig}); err != nil {
			return err
		}
	}
	a.open = -1
	return a.emit("content_block_stop", struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
	}{"content_block_stop", i})
}

// blockDelta is a content_block_delta's delta: its type and the one
// member of that type.
type blockDelta struct {
	Type        string  `json:"type"`
	Text        *string `json:"text,omitempty"`
	Thinking    *string `json:"thinking,omitempty"`
	PartialJSON *string `json:"partial_json,omitempty"`
	Signature   *string `json:"signature,omitempty"`
}

// delta sends a content_block_delta of the open block.
func (a *AnthropicAnswer) delta(d any) error {
	return a.emit("content_block_delta", struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
		Delta any    `json:"delta"`
	}{"content_block_delta", a.open, d})
}

func (a *AnthropicAnswer) emit(event string, data any) error {
	if a.Write == nil {
		return nil
	}
	return a.Write(AnthropicEvent(event, data))
}

// AnthropicEvent is one server-sent event of a Messages stream:
// "event: <event>\ndata: <data as JSON>\n\n".
func AnthropicEvent(event string, data any) []byte {
	b, err := json.Marshal(data)
	if err != nil {
		b = []byte(`{}`)
	}
	out := make([]byte, 0, len(event)+len(b)+16)
	out = append(out, "event: "...)
	out = append(out, event...)
	out = append(out, "\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// AnthropicErrorBody is the Messages API's error shape,
// {"type":"error","error":{"type","message"}}.
type AnthropicErrorBody struct {
	Type  string             `json:"type"` // "error"
	Error AnthropicErrorInfo `json:"error"`
}

// AnthropicErrorInfo is an error's "type" (invalid_request_error,
// authentication_error, permission_error, not_found_error,
// request_too_large, rate_limit_error, api_error, overloaded_error) and
// message.
type AnthropicErrorInfo struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// NewAnthropicError is the error body of typ and message.
func NewAnthropicError(typ, message string) AnthropicErrorBody {
	return AnthropicErrorBody{Type: "error", Error: AnthropicErrorInfo{Type: typ, Message: message}}
}
