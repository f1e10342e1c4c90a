package translate

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// sseEvents splits a Messages stream into its events: each "event: X"
// line's name and its data line.
func sseEvents(t *testing.T, stream string) (names []string, data []map[string]any) {
	t.Helper()
	if !strings.HasSuffix(stream, "\n\n") {
		t.Fatalf("stream %q does not end with a blank line", stream)
	}
	for _, ev := range strings.Split(strings.TrimSuffix(stream, "\n\n"), "\n\n") {
		name, d, ok := strings.Cut(ev, "\ndata: ")
		if !ok || !strings.HasPrefix(name, "event: ") {
			t.Fatalf("event %q is not an event line and a data line", ev)
		}
		var obj map[string]any
		if err := json.Unmarshal([]byte(d), &obj); err != nil {
			t.Fatalf("event %q: data is not JSON: %v", ev, err)
		}
		name = strings.TrimPrefix(name, "event: ")
		if obj["type"] != name {
			t.Fatalf("event %q: data type %v", ev, obj["type"])
		}
		names, data = append(names, name), append(data, obj)
	}
	return names, data
}

// TestAnthropicAnswerStream: the parts of an answer become Anthropic's
// event sequence (Anthropic API reference, "Streaming Messages"):
// message_start and a ping, a block per kind in the order the parts came
// (thinking with its signature_delta before its stop, text, tool_use with
// input_json_delta pieces), message_delta with the stop reason and usage,
// message_stop; and Message is the same answer whole.
func TestAnthropicAnswerStream(t *testing.T) {
	var out strings.Builder
	a := AnthropicAnswer{ID: "msg_r1", Model: "m", InputTokens: 7, Write: func(p []byte) error { out.Write(p); return nil }}
	steps := []func() error{
		a.Start,
		func() error { return a.Thinking("let me ") },
		func() error { return a.Thinking("think") },
		func() error { return a.Text("Hello") },
		func() error { return a.Text("") }, // nothing
		func() error { return a.ToolCall(0, "call_abc", "get_weather", `{"city":`) },
		func() error { return a.ToolCall(0, "", "", `"Paris"}`) },
		func() error { return a.ToolCall(1, "", "other", ``) },
		func() error { return a.Finish("tool_calls", &Usage{PromptTokens: 11, CompletionTokens: 5}) },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	names, data := sseEvents(t, out.String())
	wantNames := []string{"message_start", "ping",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
		"content_block_start", "content_block_stop",
		"message_delta", "message_stop"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Fatalf("events\n got %q\nwant %q", names, wantNames)
	}
	sig := a.Message().Content[0].Signature
	if sig == "" {
		t.Fatal("no signature on the thinking block")
	}
	want := []string{
		`{"type":"message_start","message":{"id":"msg_r1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":7,"output_tokens":0}}}`,
		`{"type":"ping"}`,
		`{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"let me "}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"think"}}`,
		`{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"` + sig + `"}}`,
		`{"type":"content_block_stop","index":0}`,
		`{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`,
		`{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hello"}}`,
		`{"type":"content_block_stop","index":1}`,
		`{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_abc","name":"get_weather","input":{}}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`,
		`{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`,
		`{"type":"content_block_stop","index":2}`,
		`{"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_r1_1","name":"other","input":{}}}`,
		`{"type":"content_block_stop","index":3}`,
		`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":11,"output_tokens":5}}`,
		`{"type":"message_stop"}`,
	}
	for i := range want {
		if !reflect.DeepEqual(data[i], jsonOf(t, want[i])) {
			g, _ := json.Marshal(data[i])
			t.Errorf("event %d\n got %s\nwant %s", i, g, want[i])
		}
	}
	msg, _ := json.Marshal(a.Message())
	wantMsg := `{"id":"msg_r1","type":"message","role":"assistant","model":"m","content":[
	 {"type":"thinking","thinking":"let me think","signature":"` + sig + `"},{"type":"text","text":"Hello"},
	 {"type":"tool_use","id":"toolu_abc","name":"get_weather","input":{"city":"Paris"}},
	 {"type":"tool_use","id":"toolu_r1_1","name":"other","input":{}}],
	 "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":11,"output_tokens":5}}`
	if !reflect.DeepEqual(jsonOf(t, string(msg)), jsonOf(t, wantMsg)) {
		t.Errorf("message\n got %s\nwant %s", msg, wantMsg)
	}
}

// TestAnthropicAnswerWhole: without Write nothing is streamed and the
// message is built the same; a tool call's parts are joined even after
// another block began; a provider that reported no usage gets the
// estimate as input_tokens.
func TestAnthropicAnswerWhole(t *testing.T) {
	a := AnthropicAnswer{ID: "msg_x", Model: "m", InputTokens: 3}
	_ = a.Start()
	_ = a.Text("a")
	_ = a.ToolCall(0, "", "f", `{"x":`)
	_ = a.Text("b") // a new text block after the tool call
	_ = a.ToolCall(0, "", "", `1}`)
	_ = a.ToolCall(1, "", "g", ``)
	if err := a.Finish("stop", nil); err != nil {
		t.Fatal(err)
	}
	m := a.Message()
	if len(m.Content) != 4 || m.Content[2].Text != "b" || *m.StopReason != "tool_use" || m.Usage != (AnthropicUsage{3, 0}) {
		t.Errorf("message %+v", m)
	}
	b, _ := json.Marshal(m.Content[1])
	if string(b) != `{"type":"tool_use","id":"toolu_x_0","name":"f","input":{"x":1}}` {
		t.Errorf("tool_use %s", b)
	}
	// A call without arguments has input {}.
	if b, _ := json.Marshal(m.Content[3]); string(b) != `{"type":"tool_use","id":"toolu_x_1","name":"g","input":{}}` {
		t.Errorf("tool_use %s", b)
	}
}

// TestRegression_AnthropicToolArgumentsNotAnObject: a provider's tool
// call whose arguments are not a JSON object ("{broken", "[1,2]") was
// answered with input {} whole, its arguments silently dropped, and
// streamed as input_json_delta then message_stop, which a client's JSON
// parse throws on. Now both are ErrMalformedAnswer quoting the
// arguments: streamed, after the input_json_delta and before the block's
// content_block_stop (nothing more is sent), whole at Finish.
func TestRegression_AnthropicToolArgumentsNotAnObject(t *testing.T) {
	for _, args := range []string{`{broken`, `[1,2]`, `"text"`, `null`, `{"a":1}x`} {
		for _, stream := range []bool{false, true} {
			var out strings.Builder
			a := AnthropicAnswer{ID: "msg_x", Model: "m"}
			if stream {
				a.Write = func(p []byte) error { out.Write(p); return nil }
			}
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			if err := a.ToolCall(0, "call_1", "f", args); err != nil {
				t.Fatalf("%q: ToolCall: %v", args, err)
			}
			err := a.Finish("tool_calls", nil)
			if !errors.Is(err, ErrMalformedAnswer) || !strings.Contains(err.Error(), args) {
				t.Errorf("%q stream %v: Finish: %v, want ErrMalformedAnswer quoting the arguments", args, stream, err)
			}
			if !stream {
				continue
			}
			names, data := sseEvents(t, out.String())
			want := []string{"message_start", "ping", "content_block_start", "content_block_delta"}
			if !reflect.DeepEqual(names, want) {
				t.Errorf("%q: events %q, want %q", args, names, want)
			} else if d := data[3]["delta"].(map[string]any); d["partial_json"] != args {
				t.Errorf("%q: delta %v", args, d)
			}
		}
	}
	// Streamed, the check is at the block's end: another block after it.
	a := AnthropicAnswer{ID: "msg_x", Model: "m", Write: func([]byte) error { return nil }}
	_ = a.Start()
	_ = a.ToolCall(0, "", "f", `{bro`)
	_ = a.ToolCall(0, "", "", `ken`)
	if err := a.Text("after"); !errors.Is(err, ErrMalformedAnswer) {
		t.Errorf("text after a broken call: %v", err)
	}
}

// TestAnthropicAnswerOneToolCall: disable_parallel_tool_use keeps the
// first call only.
func TestAnthropicAnswerOneToolCall(t *testing.T) {
	var out strings.Builder
	a := AnthropicAnswer{ID: "msg_x", Model: "m", OneToolCall: true, Write: func(p []byte) error { out.Write(p); return nil }}
	_ = a.Start()
	_ = a.ToolCall(1, "call_1", "f", `{}`)
	_ = a.ToolCall(0, "call_0", "g", `{}`)
	_ = a.ToolCall(1, "", "", ``)
	_ = a.Finish("tool_calls", nil)
	if c := a.Message().Content; len(c) != 1 || c[0].Name != "f" {
		t.Errorf("content %+v", c)
	}
	if strings.Count(out.String(), "event: content_block_start") != 1 {
		t.Errorf("stream %s", out.String())
	}
}

// TestAnthropicAnswerLateToolPart: streamed, a tool call's part after its
// block was closed cannot be sent: ErrMalformedAnswer.
func TestAnthropicAnswerLateToolPart(t *testing.T) {
	a := AnthropicAnswer{ID: "msg_x", Model: "m", Write: func([]byte) error { return nil }}
	_ = a.Start()
	_ = a.ToolCall(0, "", "f", `{}`)
	_ = a.ToolCall(1, "", "g", `{}`)
	if err := a.ToolCall(0, "", "", `{}`); !errors.Is(err, ErrMalformedAnswer) {
		t.Errorf("late part: %v, want ErrMalformedAnswer", err)
	}
}

// TestAnthropicAnswerWriteError: a failed write is returned as it is.
func TestAnthropicAnswerWriteError(t *testing.T) {
	boom := errors.New("boom")
	a := AnthropicAnswer{ID: "msg_x", Model: "m", Write: func([]byte) error { return boom }}
	if err := a.Start(); !errors.Is(err, boom) {
		t.Errorf("Start: %v", err)
	}
}

func TestAnthropicStopReason(t *testing.T) {
	for _, tc := range []struct {
		finish string
		tool   bool
		seq    string
		want   string
	}{
		{"stop", false, "", "end_turn"}, {"", false, "", "end_turn"}, {"length", false, "", "max_tokens"},
		{"tool_calls", false, "", "tool_use"}, {"stop", true, "", "tool_use"}, {"content_filter", false, "", "refusal"},
		{"stop", false, "END", "stop_sequence"}, {"length", false, "END", "max_tokens"}, {"stop", true, "END", "tool_use"},
	} {
		if got := AnthropicStopReason(tc.finish, tc.tool, tc.seq); got != tc.want {
			t.Errorf("AnthropicStopReason(%q, %v, %q) = %q, want %q", tc.finish, tc.tool, tc.seq, got, tc.want)
		}
	}
}

func TestAnthropicEventAndError(t *testing.T) {
	got := string(AnthropicEvent("error", NewAnthropicError("overloaded_error", "busy")))
	want := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
