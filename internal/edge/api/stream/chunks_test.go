package stream

import (
	"encoding/json"
	"testing"

	"pgregory.net/rapid"

	"iop/internal/edge/contract"
)

// TestChunkRendererBytesAreMarshals checks that ChatChunks, which
// encodes every chunk into one reused buffer, hands its sink exactly the
// bytes json.Marshal gives for the chunk, for any text (HTML characters,
// invalid UTF-8, line ends), reasoning and tool-call parts, and that the
// data of one chunk is not changed by the chunks after it once the sink
// copied it.
func TestChunkRendererBytesAreMarshals(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		text := rapid.SampledFrom([]string{"", "hi", "<a href=\"x\">&amp;</a>", "line\nend\r\u2028", "\xff\xfe", "é😀", "\\\"'"})
		var got, want [][]byte
		c := NewChatChunks("chatcmpl-run_1", 1767225600, "m<1>", func(data []byte, _ string) error {
			got = append(got, append([]byte(nil), data...))
			return nil
		})
		marshal := func(v chatChunk) {
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, b)
		}
		head := func(choices []chunkChoice, u *Usage) chatChunk {
			return chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model, Choices: choices, Usage: u}
		}
		empty := ""
		marshal(head([]chunkChoice{{Delta: chunkDelta{Role: "assistant", Content: &empty}}}, nil))
		for range rapid.IntRange(0, 4).Draw(t, "deltas") {
			ev := contract.Event{Kind: contract.EventDelta, Text: text.Draw(t, "text"), Thinking: text.Draw(t, "thinking")}
			for i := range rapid.IntRange(0, 2).Draw(t, "calls") {
				ev.ToolCalls = append(ev.ToolCalls, contract.ToolCallPart{Index: i, ID: text.Draw(t, "id"), Name: text.Draw(t, "name"), Arguments: text.Draw(t, "args")})
			}
			if ev.Thinking != "" {
				s := ev.Thinking
				marshal(head([]chunkChoice{{Delta: chunkDelta{ReasoningContent: &s}}}, nil))
			}
			if ev.Text != "" {
				s := ev.Text
				marshal(head([]chunkChoice{{Delta: chunkDelta{Content: &s}}}, nil))
			}
			if len(ev.ToolCalls) > 0 {
				var parts []toolCall
				for _, p := range ev.ToolCalls {
					index := p.Index
					tc := toolCall{Index: &index, ID: p.ID, Function: toolCallFunction{Name: p.Name, Arguments: p.Arguments}}
					if tc.ID != "" {
						tc.Type = "function"
					}
					parts = append(parts, tc)
				}
				marshal(head([]chunkChoice{{Delta: chunkDelta{ToolCalls: parts}}}, nil))
			}
			if err := c.Delta(&ev); err != nil {
				t.Fatal(err)
			}
		}
		finish := rapid.SampledFrom([]string{"stop", "length", "tool_calls"}).Draw(t, "finish")
		marshal(head([]chunkChoice{{FinishReason: &finish}}, nil))
		var u *Usage
		if rapid.Bool().Draw(t, "usage") {
			u = &Usage{PromptTokens: 3, CompletionTokens: 5, TotalTokens: 8}
			marshal(head([]chunkChoice{}, u))
		}
		if err := c.end(finish, u); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d chunks, want %d", len(got), len(want))
		}
		for i := range want {
			if string(got[i]) != string(want[i]) {
				t.Fatalf("chunk %d:\n got %s\nwant %s", i, got[i], want[i])
			}
		}
	})
}
