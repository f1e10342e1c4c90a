package api

import (
	"encoding/json"

	"iop/internal/edge/contract"
)

// chunkRenderer renders a normalized run's answer as the OpenAI
// chat.completion.chunk events a streaming client of the chat route gets,
// handing each event's data to sink with the output text it carries (a
// delta's content): a first chunk with the assistant role, one chunk per
// delta's reasoning (delta.reasoning_content), text and tool-call parts
// (delta.tool_calls with index, and id, type and name on a call's first
// part), a final chunk with the finish reason and, when asked for, a usage
// chunk (choices []). The stream's `data: [DONE]` is the sink owner's. The
// HTTP answer (chatRender.stream), the runs recorder (runRecorder) and a
// background response's run log (package responses, through ChatChunks)
// all render through one.
type chunkRenderer struct {
	id      string // "chatcmpl-" + run id
	created int64  // Unix seconds
	model   string // the model name the client asked for
	// sink takes one event's data (a chunk's JSON) and the output text it
	// carries; its error ends the rendering.
	sink    func(data []byte, text string) error
	started bool // the role chunk went out
}

// start writes the role chunk, once.
func (c *chunkRenderer) start() error {
	if c.started {
		return nil
	}
	c.started = true
	empty := ""
	return c.chunk(chunkDelta{Role: "assistant", Content: &empty}, nil, "")
}

// delta writes the chunks of one delta event, after the role chunk.
func (c *chunkRenderer) delta(ev *contract.Event) error {
	if err := c.start(); err != nil {
		return err
	}
	if s := ev.Thinking; s != "" {
		if err := c.chunk(chunkDelta{ReasoningContent: &s}, nil, ""); err != nil {
			return err
		}
	}
	if s := ev.Text; s != "" {
		if err := c.chunk(chunkDelta{Content: &s}, nil, s); err != nil {
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

// end writes the final chunk with finish (after the role chunk, for an
// answer without deltas) and, when u is not nil, the usage chunk.
func (c *chunkRenderer) end(finish string, u *usage) error {
	if err := c.start(); err != nil {
		return err
	}
	if err := c.chunk(chunkDelta{}, &finish, ""); err != nil {
		return err
	}
	if u == nil {
		return nil
	}
	return c.write(chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model,
		Choices: []chunkChoice{}, Usage: u}, "")
}

// chunk writes one chunk with a single choice.
func (c *chunkRenderer) chunk(delta chunkDelta, finish *string, text string) error {
	return c.write(chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model,
		Choices: []chunkChoice{{Delta: delta, FinishReason: finish}}}, text)
}

func (c *chunkRenderer) write(v chatChunk, text string) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.sink(b, text)
}
