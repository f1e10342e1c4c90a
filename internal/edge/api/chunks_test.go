package api

import (
	"encoding/json"
	"mime"
	"net/http"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"iop/internal/edge/contract"
)

// TestChunkRendererBytesAreMarshals checks that chunkRenderer, which
// encodes every chunk into one reused buffer, hands its sink exactly the
// bytes json.Marshal gives for the chunk, for any text (HTML characters,
// invalid UTF-8, line ends), reasoning and tool-call parts, and that the
// data of one chunk is not changed by the chunks after it once the sink
// copied it.
func TestChunkRendererBytesAreMarshals(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		text := rapid.SampledFrom([]string{"", "hi", "<a href=\"x\">&amp;</a>", "line\nend\r\u2028", "\xff\xfe", "é😀", "\\\"'"})
		var got, want [][]byte
		c := chunkRenderer{id: "chatcmpl-run_1", created: 1767225600, model: "m<1>", sink: func(data []byte, _ string) error {
			got = append(got, append([]byte(nil), data...))
			return nil
		}}
		marshal := func(v chatChunk) {
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, b)
		}
		head := func(choices []chunkChoice, u *usage) chatChunk {
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
			if err := c.delta(&ev); err != nil {
				t.Fatal(err)
			}
		}
		finish := rapid.SampledFrom([]string{"stop", "length", "tool_calls"}).Draw(t, "finish")
		marshal(head([]chunkChoice{{FinishReason: &finish}}, nil))
		var u *usage
		if rapid.Bool().Draw(t, "usage") {
			u = &usage{PromptTokens: 3, CompletionTokens: 5, TotalTokens: 8}
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

// TestIsEventStreamEqualsParse checks that isEventStream, which skips
// mime.ParseMediaType for a type that does not name event-stream, tells
// every content type as the parse does.
func TestIsEventStreamEqualsParse(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ct := rapid.OneOf(
			rapid.SampledFrom([]string{"text/event-stream", "TEXT/Event-Stream; charset=utf-8", "application/json; charset=utf-8",
				"text/event-stream;", " text/event-stream ", "text/event-streamx", "text/plain; x=event-stream", "", "text/EVENT-STREAM"}),
			rapid.StringMatching(`[ a-zA-Z/;=\-"\t]{0,24}(event-stream|EVENT-STREAM|Event-Stream)?[ a-z;=\-"]{0,8}`),
		).Draw(t, "content type")
		mediaType, _, err := mime.ParseMediaType(ct)
		if want := err == nil && mediaType == "text/event-stream"; isEventStream(ct) != want {
			t.Fatalf("isEventStream(%q) = %v, want %v", ct, !want, want)
		}
	})
}

// TestTunnelHeadValuesStandAlone checks that the relayed head's header
// values, which share one allocation, stay apart: a value added to one
// header after the head does not change another, and each is the
// provider's (the Content-Length the edge's).
func TestTunnelHeadValuesStandAlone(t *testing.T) {
	body := `{"ok":true}`
	rr, w := benchResponse(&listRun{msgs: []*contract.Message{decoded(wholeAnswer(200,
		map[string]string{"Content-Type": "application/json", "x-one": "1", "X-Two": "2", "Connection": "close"}, body))}})
	if reason := rr.tunnel(); reason != ReasonCompleted || w.n != int64(len(body)) {
		t.Fatalf("tunnel ended %q after %d bytes", reason, w.n)
	}
	h := w.Header()
	for _, name := range []string{"Content-Type", "X-One", "X-Two", "Content-Length"} {
		h.Add(name, "added")
	}
	want := http.Header{"Content-Type": {"application/json", "added"}, "X-One": {"1", "added"}, "X-Two": {"2", "added"},
		"Content-Length": {"11", "added"}}
	for name, v := range want {
		if !slices.Equal(h[name], v) {
			t.Errorf("%s: %q, want %q", name, h[name], v)
		}
	}
	if _, ok := h["Connection"]; ok {
		t.Error("the provider's Connection was relayed")
	}
}
