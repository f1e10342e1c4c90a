package stream

import (
	"bytes"
	"encoding/json"

	"iop/internal/edge/contract"
)

// ChatChunks renders a normalized run's answer as the OpenAI
// chat.completion.chunk events a streaming client of the chat route gets,
// handing each event's data to a sink with the output text it carries (a
// delta's content): a first chunk with the assistant role, one chunk per
// delta's reasoning (delta.reasoning_content), text and tool-call parts
// (delta.tool_calls with index, and id, type and name on a call's first
// part), a final chunk with the finish reason and, when asked for, a usage
// chunk (choices []). The stream's `data: [DONE]` is the sink owner's.
// The chat route's HTTP answer (package openai), a run of the runs API
// (package runsapi) and a background response's run log (package
// responses) all render through one.
//
// Every chunk is encoded into one buffer the renderer keeps, from one
// chatChunk value it reuses, by one json.Encoder: a delta's chunk costs no
// allocation, and its bytes are json.Marshal's. One goroutine uses a
// ChatChunks.
type ChatChunks struct {
	id      string // "chatcmpl-" + run id
	created int64  // Unix seconds
	model   string // the model name the client asked for
	// sink takes one event's data (a chunk's JSON, valid only during the
	// call: the renderer reuses it) and the output text it carries; its
	// error ends the rendering.
	sink    func(data []byte, text string) error
	started bool // the role chunk went out

	v      chatChunk      // the chunk being written; emptied after
	choice [1]chunkChoice // v's one choice
	finish string         // the final chunk's finish reason
	buf    bytes.Buffer   // enc's output: the chunk's JSON and a newline
	enc    *json.Encoder  // writes into buf, created with the first chunk
}

// NewChatChunks returns chunks that carry id, created (Unix seconds) and
// model, handed to sink; sink's error ends the rendering. data is valid
// only during the call (the renderer reuses its buffer): a sink that
// keeps it copies it.
func NewChatChunks(id string, created int64, model string, sink func(data []byte, text string) error) *ChatChunks {
	return &ChatChunks{id: id, created: created, model: model, sink: sink}
}

// Usage is OpenAI's usage object, in tokens.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// toolCall is one entry of a delta's "tool_calls" (OpenAI API reference,
// chat completion chunk object): Index says which call a part belongs to;
// ID, Type and Function.Name come with a call's first part only, and each
// part's Function.Arguments is appended to the call's arguments.
type toolCall struct {
	Index    *int             `json:"index,omitempty"` // deltas only
	ID       string           `json:"id,omitempty"`
	Type     string           `json:"type,omitempty"` // "function"
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"` // JSON text, or a piece of it
}

// chatChunk is one streamed event (object "chat.completion.chunk").
type chatChunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *Usage        `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	Logprobs     *struct{}  `json:"logprobs"` // always null
	FinishReason *string    `json:"finish_reason"`
}

type chunkDelta struct {
	Role             string     `json:"role,omitempty"`
	Content          *string    `json:"content,omitempty"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCall `json:"tool_calls,omitempty"`
}

// emptyContent is the role chunk's content, "" (not left out).
var emptyContent = ""

// start writes the role chunk, once.
func (c *ChatChunks) start() error {
	if c.started {
		return nil
	}
	c.started = true
	return c.chunk(chunkDelta{Role: "assistant", Content: &emptyContent}, nil, "")
}

// Delta renders the chunks of one delta event, after the role chunk.
func (c *ChatChunks) Delta(ev *contract.Event) error {
	if err := c.start(); err != nil {
		return err
	}
	if ev.Thinking != "" {
		if err := c.chunk(chunkDelta{ReasoningContent: &ev.Thinking}, nil, ""); err != nil {
			return err
		}
	}
	if ev.Text != "" {
		if err := c.chunk(chunkDelta{Content: &ev.Text}, nil, ev.Text); err != nil {
			return err
		}
	}
	if len(ev.ToolCalls) == 0 {
		return nil
	}
	parts := make([]toolCall, 0, len(ev.ToolCalls))
	for _, part := range ev.ToolCalls {
		index := part.Index
		tc := toolCall{Index: &index, ID: part.ID,
			Function: toolCallFunction{Name: part.Name, Arguments: part.Arguments}}
		if tc.ID != "" {
			tc.Type = "function"
		}
		parts = append(parts, tc)
	}
	return c.chunk(chunkDelta{ToolCalls: parts}, nil, "")
}

// End renders the chunk with the finish reason (after the role chunk, for
// an answer without deltas) and the usage chunk, in tokens.
func (c *ChatChunks) End(finish string, promptTokens, completionTokens int) error {
	return c.end(finish, &Usage{PromptTokens: promptTokens, CompletionTokens: completionTokens,
		TotalTokens: promptTokens + completionTokens})
}

// Finish renders the chunk with the finish reason, as End does, without
// the usage chunk.
func (c *ChatChunks) Finish(finish string) error { return c.end(finish, nil) }

// end writes the final chunk with finish (after the role chunk, for an
// answer without deltas) and, when u is not nil, the usage chunk.
func (c *ChatChunks) end(finish string, u *Usage) error {
	if err := c.start(); err != nil {
		return err
	}
	c.finish = finish
	if err := c.chunk(chunkDelta{}, &c.finish, ""); err != nil {
		return err
	}
	if u == nil {
		return nil
	}
	return c.write(c.choice[:0], u, "")
}

// chunk writes one chunk with a single choice.
func (c *ChatChunks) chunk(delta chunkDelta, finish *string, text string) error {
	c.choice[0] = chunkChoice{Delta: delta, FinishReason: finish}
	return c.write(c.choice[:], nil, text)
}

// write encodes the chunk of choices and u (c.v, as json.Marshal would)
// and hands it to sink. It empties v and choice after, so that they hold
// no event's text.
func (c *ChatChunks) write(choices []chunkChoice, u *Usage, text string) error {
	if c.enc == nil {
		c.enc = json.NewEncoder(&c.buf)
	}
	c.v = chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model, Choices: choices, Usage: u}
	c.buf.Reset()
	err := c.enc.Encode(&c.v)
	c.v, c.choice[0] = chatChunk{}, chunkChoice{}
	if err != nil {
		return err
	}
	b := c.buf.Bytes()
	return c.sink(b[:len(b)-1], text) // without Encode's newline
}
