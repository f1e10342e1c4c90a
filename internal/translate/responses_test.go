package translate

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// chatOf decodes a Responses body and translates its input alone.
func chatOf(t *testing.T, body string) (ResponsesRequest, ResponsesChat, map[string]any) {
	t.Helper()
	rq, err := DecodeResponsesRequest([]byte(body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	chat, err := rq.ChatBody(rq.Model, rq.Input)
	if err != nil {
		t.Fatalf("%s: ChatBody: %v", body, err)
	}
	var out map[string]any
	if err := json.Unmarshal(chat.Body, &out); err != nil {
		t.Fatal(err)
	}
	return rq, chat, out
}

// TestResponsesToChat: each Responses request field becomes its chat
// completions counterpart (OpenAI API reference, "Create a model response"
// and "Create chat completion"), and the body always streams with usage.
func TestResponsesToChat(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       map[string]any // members of the chat body, as JSON
	}{
		{"string input", `{"model":"m","input":"hi"}`,
			map[string]any{"model": "m", "stream": true, "stream_options": map[string]any{"include_usage": true},
				"messages": []any{map[string]any{"role": "user", "content": "hi"}}}},
		{"instructions, developer", `{"model":"m","instructions":"be brief","input":[{"role":"developer","content":"rules"},{"role":"user","content":"hi"}]}`,
			map[string]any{"messages": []any{map[string]any{"role": "system", "content": "be brief"},
				map[string]any{"role": "system", "content": "rules"}, map[string]any{"role": "user", "content": "hi"}}}},
		{"parts and an image", `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"what is"},{"type":"input_image","image_url":"data:image/png;base64,AAAA","detail":"low"}]}]}`,
			map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{
				map[string]any{"type": "text", "text": "what is"},
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64,AAAA", "detail": "low"}}}}}}},
		{"a tool round trip", `{"model":"m","input":[{"role":"user","content":"weather?"},
			{"type":"message","role":"assistant","content":[{"type":"output_text","text":"checking"}]},
			{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
			{"type":"function_call","call_id":"c2","name":"get_time","arguments":""},
			{"type":"function_call_output","call_id":"c1","output":"21C"},
			{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"noon"}]},
			{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"thought"}]}]}`,
			map[string]any{"messages": []any{map[string]any{"role": "user", "content": "weather?"},
				map[string]any{"role": "assistant", "content": "checking", "tool_calls": []any{
					map[string]any{"id": "c1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city":"Paris"}`}},
					map[string]any{"id": "c2", "type": "function", "function": map[string]any{"name": "get_time", "arguments": "{}"}}}},
				map[string]any{"role": "tool", "tool_call_id": "c1", "content": "21C"},
				map[string]any{"role": "tool", "tool_call_id": "c2", "content": "noon"}}}},
		{"a call with no text before it", `{"model":"m","input":[{"role":"user","content":"x"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`,
			map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"},
				map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{
					map[string]any{"id": "c", "type": "function", "function": map[string]any{"name": "f", "arguments": "{}"}}}}}}},
		{"tools and choices", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object"},"strict":true}],"tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false}`,
			map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "description": "d",
				"parameters": map[string]any{"type": "object"}, "strict": true}}},
				"tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "f"}}, "parallel_tool_calls": false}},
		{"allowed tools", `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"f"}]}}`,
			map[string]any{"tool_choice": map[string]any{"type": "allowed_tools", "allowed_tools": map[string]any{"mode": "required",
				"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}}}}},
		{"sampling", `{"model":"m","input":"x","max_output_tokens":9,"temperature":0.2,"top_p":0.9,"user":"u1","reasoning":{"effort":"low"}}`,
			map[string]any{"max_tokens": 9.0, "temperature": 0.2, "top_p": 0.9, "user": "u1", "reasoning_effort": "low"}},
		{"json_schema", `{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"city","schema":{"type":"object"},"strict":true}}}`,
			map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "city", "schema": map[string]any{"type": "object"}, "strict": true}}}},
		{"json_object", `{"model":"m","input":"x","text":{"format":{"type":"json_object"}}}`,
			map[string]any{"response_format": map[string]any{"type": "json_object"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, out := chatOf(t, tc.body)
			for k, v := range tc.want {
				got, _ := json.Marshal(out[k])
				want, _ := json.Marshal(v)
				if string(got) != string(want) {
					t.Errorf("%s:\n got %s\nwant %s", k, got, want)
				}
			}
		})
	}
	// A text format sends no response_format; tools absent send no
	// tool_choice.
	_, _, out := chatOf(t, `{"model":"m","input":"x","text":{"format":{"type":"text"}},"tool_choice":"auto"}`)
	for _, k := range []string{"response_format", "tools", "tool_choice", "parallel_tool_calls", "max_tokens"} {
		if _, ok := out[k]; ok {
			t.Errorf("%s sent: %v", k, out)
		}
	}
}

// TestResponsesNeeds: what a request needs of its provider, and the
// characters its estimate counts.
func TestResponsesNeeds(t *testing.T) {
	rq, chat, _ := chatOf(t, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"abcd"},{"type":"input_image","image_url":"https://x/y.png"}]}],
		"tools":[{"type":"function","name":"f"}],"tool_choice":"required","reasoning":{"effort":"high"}}`)
	// A forced call ("required") is served by every provider kind: it needs
	// no OpenAI-compatible one.
	if !rq.NeedsTools || rq.NeedsToolChoice || !rq.Thinks || !chat.Vision || !chat.RemoteImages {
		t.Errorf("needs %+v %+v", rq, chat)
	}
	if rq, _, _ := chatOf(t, `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"parallel_tool_calls":false}`); !rq.NeedsToolChoice {
		t.Errorf("parallel_tool_calls false without a forced call does not need an OpenAI-compatible provider: %+v", rq)
	}
	if want := 4 + len(`[{"type":"function","function":{"name":"f"}}]`); chat.Chars != want {
		t.Errorf("chars %d, want %d", chat.Chars, want)
	}
	rq, chat, _ = chatOf(t, `{"model":"m","input":"x","reasoning":{"effort":"none"},"parallel_tool_calls":false}`)
	if rq.NeedsTools || rq.NeedsToolChoice || rq.Thinks || chat.Vision {
		t.Errorf("needs %+v %+v", rq, chat)
	}
	if rq, _, _ = chatOf(t, `{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],"parallel_tool_calls":false}`); !rq.NeedsToolChoice {
		t.Error("parallel_tool_calls false with tools needs tool_choice")
	}
}

// TestResponsesEcho: the response object repeats the request's settings,
// with the API's defaults for those left out.
func TestResponsesEcho(t *testing.T) {
	rq, err := DecodeResponsesRequest([]byte(`{"model":"m","input":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(rq.Echo)
	want := `{"instructions":null,"max_output_tokens":null,"parallel_tool_calls":true,"temperature":null,"top_p":null,"tools":[],"tool_choice":"auto","text":{"format":{"type":"text"}},"reasoning":{"effort":null,"summary":null},"metadata":{},"user":null,"truncation":"disabled"}`
	if string(got) != want {
		t.Errorf("echo\n got %s\nwant %s", got, want)
	}
	if !rq.Store || rq.Stream || rq.Background {
		t.Errorf("defaults %+v", rq)
	}
}

// TestResponsesDecodeErrors: a refused request is a *FieldError naming the
// offending field.
func TestResponsesDecodeErrors(t *testing.T) {
	for body, field := range map[string]string{
		`null`:                      "",
		`{"model":"m","input":[1]}`: "input[0]",
		`{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":{"x":1}}]}`:                    "input[0].output",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text"}]}]}`:                                 "input[0].content[0].text",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x","detail":"max"}]}]}`: "input[0].content[0].detail",
		`{"model":"m","input":[{"type":"reasoning","summary":[{"type":"text","text":"x"}]}]}`:                       "input[0].summary[0].type",
		`{"model":"m","input":"x","tools":[{"type":"custom","name":"c"}]}`:                                          "tools[0].type",
		`{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":[]}]}`:                        "tools[0].parameters",
		`{"model":"m","input":"x","tool_choice":"required"}`:                                                        "tool_choice",
		`{"model":"m","input":"x","metadata":{"k":1}}`:                                                              "metadata",
		`{"model":"m","input":"x","prompt":{"id":"p"}}`:                                                             "prompt",
		`{"model":"m","input":"x","reasoning":{"summary":"long"}}`:                                                  "reasoning.summary",
	} {
		_, err := DecodeResponsesRequest([]byte(body))
		fe, ok := errors.AsType[*FieldError](err)
		if !ok {
			t.Errorf("%s: %v, want a *FieldError", body, err)
			continue
		}
		if fe.Field != field {
			t.Errorf("%s: field %q (%v), want %q", body, fe.Field, err, field)
		}
	}
	var long strings.Builder
	long.WriteString(`{"model":"m","input":"x","metadata":{`)
	for i := range 17 {
		if i > 0 {
			long.WriteString(",")
		}
		fmt.Fprintf(&long, `"k%d":"v"`, i)
	}
	long.WriteString("}}")
	if _, err := DecodeResponsesRequest([]byte(long.String())); err == nil {
		t.Error("17 metadata pairs accepted")
	}
}

// TestResponseItemRoundTrip: every item shape written (MarshalJSON) reads
// back as itself, as the store needs it.
func TestResponseItemRoundTrip(t *testing.T) {
	for _, it := range []ResponseItem{
		{Type: ItemMessage, ID: "msg_1", Status: "completed", Role: "assistant", Content: []ResponsePart{{Type: PartOutputText, Text: "hi"}}},
		{Type: ItemMessage, ID: "msg_2", Role: "user", Content: []ResponsePart{{Type: PartInputText, Text: "x"}, {Type: PartInputImage, ImageURL: "data:image/png;base64,AA", Detail: "high"}}},
		{Type: ItemFunctionCall, ID: "fc_1", Status: "completed", CallID: "c", Name: "f", Arguments: ""},
		{Type: ItemFunctionCallOutput, ID: "fco_1", CallID: "c", Output: json.RawMessage(`"ok"`)},
		{Type: ItemReasoning, ID: "rs_1", Summary: []ResponsePart{{Type: PartSummaryText, Text: "t"}}},
	} {
		doc, err := json.Marshal(it)
		if err != nil {
			t.Fatal(err)
		}
		var back ResponseItem
		if err := json.Unmarshal(doc, &back); err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		again, _ := json.Marshal(back)
		if string(again) != string(doc) {
			t.Errorf("round trip\n got %s\nwant %s", again, doc)
		}
	}
	// The members the official clients require are there even when empty.
	doc, _ := json.Marshal(ResponseItem{Type: ItemFunctionCall, CallID: "c", Name: "f"})
	if !strings.Contains(string(doc), `"arguments":""`) {
		t.Errorf("function call %s", doc)
	}
	doc, _ = json.Marshal(ResponseItem{Type: ItemReasoning, ID: "rs"})
	if !strings.Contains(string(doc), `"summary":[]`) {
		t.Errorf("reasoning %s", doc)
	}
	doc, _ = json.Marshal(ResponsePart{Type: PartOutputText, Text: "x"})
	if string(doc) != `{"type":"output_text","text":"x","annotations":[],"logprobs":[]}` {
		t.Errorf("output_text %s", doc)
	}
}

// builderEvents runs calls on a builder and returns the event types and
// the decoded events.
func builderEvents(t *testing.T, calls func(b *ResponseBuilder) error) ([]string, []map[string]any, []ResponseItem) {
	t.Helper()
	var types []string
	var evs []map[string]any
	n := 0
	b := &ResponseBuilder{
		NewID: func(prefix string) string { n++; return fmt.Sprintf("%s_%d", prefix, n) },
		Emit: func(ev ResponseEvent) error {
			var obj map[string]any
			if err := json.Unmarshal(ev.Data, &obj); err != nil {
				return err
			}
			if obj["type"] != ev.Type || obj["sequence_number"] != float64(len(evs)) {
				t.Errorf("event %s: %s", ev.Type, ev.Data)
			}
			types, evs = append(types, ev.Type), append(evs, obj)
			return nil
		},
	}
	if err := calls(b); err != nil {
		t.Fatal(err)
	}
	return types, evs, b.Output()
}

// TestResponseBuilder_InterleavedCalls: parts of two tool calls that
// interleave by index stay with their own function_call items (each
// delta names its item), both done at Finish, in output order; text after
// reasoning closes the reasoning item first.
func TestResponseBuilder_InterleavedCalls(t *testing.T) {
	types, evs, out := builderEvents(t, func(b *ResponseBuilder) error {
		for _, step := range []func() error{
			func() error { return b.Thinking("plan") },
			func() error { return b.Text("ok") },
			func() error { return b.ToolCall(0, "c0", "f", `{"a"`) },
			func() error { return b.ToolCall(1, "", "g", `{"b"`) },
			func() error { return b.ToolCall(0, "", "", `:1}`) },
			func() error { return b.ToolCall(1, "", "", `:2}`) },
			func() error { return b.Finish("completed") },
		} {
			if err := step(); err != nil {
				return err
			}
		}
		return nil
	})
	want := []string{
		"response.output_item.added", "response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
		"response.reasoning_summary_text.done", "response.reasoning_summary_part.done", "response.output_item.done",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.delta", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done",
		"response.function_call_arguments.done", "response.output_item.done",
	}
	if !slices.Equal(types, want) {
		t.Fatalf("events\n got %q\nwant %q", types, want)
	}
	if evs[16]["item_id"] != "fc_3" || evs[17]["item_id"] != "fc_5" {
		t.Errorf("deltas name items %v and %v", evs[16]["item_id"], evs[17]["item_id"])
	}
	if len(out) != 4 || out[2].Arguments != `{"a":1}` || out[3].Arguments != `{"b":2}` || out[3].CallID != "call_4" || out[3].Name != "g" {
		t.Errorf("output %+v", out)
	}
	if out[0].Summary[0].Text != "plan" || out[1].Content[0].Text != "ok" || out[1].Status != "completed" {
		t.Errorf("output %+v", out)
	}
}

// TestResponseBuilder_Unfinished: the output of an answer that failed
// midway has its text so far, status incomplete.
func TestResponseBuilder_Unfinished(t *testing.T) {
	b := &ResponseBuilder{NewID: func(p string) string { return p + "_x" }}
	_ = b.Text("part")
	out := b.Output()
	if len(out) != 1 || out[0].Status != "incomplete" || out[0].Content[0].Text != "part" {
		t.Errorf("output %+v", out)
	}
	if s, r := ResponseStatus("length"); s != "incomplete" || r != "max_output_tokens" {
		t.Errorf("length: %s %s", s, r)
	}
	if s, r := ResponseStatus("tool_calls"); s != "completed" || r != "" {
		t.Errorf("tool_calls: %s %s", s, r)
	}
}

// FuzzDecodeResponsesRequest decodes arbitrary POST /v1/responses bodies:
// no panic; a refusal is a *FieldError; an accepted request's input items
// round-trip through their stored JSON, and its chat body (references
// aside) is a JSON object for its model that always streams.
func FuzzDecodeResponsesRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","input":"hi"}`,
		`{"model":"m","instructions":"x","input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"data:image/png;base64,AA"}]}]}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}]}`,
		`{"model":"m","input":[{"type":"item_reference","id":"msg_1"},{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]}]}`,
		`{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"f"}]}}`,
		`{"model":"m","input":"x","text":{"format":{"type":"json_schema","name":"n","schema":{}}},"reasoning":{"effort":"low","summary":"auto"},"metadata":{"a":"b"}}`,
		`{"model":"m","previous_response_id":"resp_1","background":true,"stream":true,"max_output_tokens":5}`,
		`{"model":"m","input":"x","tools":[{"type":"web_search"}]}`,
		`{"model":"m","input":[{"role":"assistant","content":[{"type":"refusal","refusal":"no"}]}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		rq, err := DecodeResponsesRequest(in)
		if err != nil {
			if _, ok := errors.AsType[*FieldError](err); !ok {
				t.Fatalf("%q: error %T %v, want a *FieldError", in, err, err)
			}
			return
		}
		var items []ResponseItem
		for _, it := range rq.Input {
			doc, err := json.Marshal(it)
			if err != nil {
				t.Fatalf("%q: item %+v does not marshal: %v", in, it, err)
			}
			var back ResponseItem
			if err := json.Unmarshal(doc, &back); err != nil {
				t.Fatalf("%q: stored item %s does not read back: %v", in, doc, err)
			}
			if again, _ := json.Marshal(back); string(again) != string(doc) {
				t.Fatalf("%q: item %s reads back as %s", in, doc, again)
			}
			if it.Type != ItemReference {
				items = append(items, it)
			}
		}
		chat, err := rq.ChatBody(rq.Model, items)
		if err != nil {
			if _, ok := errors.AsType[*FieldError](err); !ok {
				t.Fatalf("%q: ChatBody error %T %v", in, err, err)
			}
			return
		}
		var body struct {
			Model  string `json:"model"`
			Stream bool   `json:"stream"`
		}
		if err := json.Unmarshal(chat.Body, &body); err != nil || body.Model != rq.Model || !body.Stream {
			t.Fatalf("%q: chat body %s: %v", in, chat.Body, err)
		}
	})
}
