package translate

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// canonicalOf decodes a translated Messages request's canonical body.
func canonicalOf(t *testing.T, req AnthropicRequest) map[string]any {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal(req.Body, &body); err != nil {
		t.Fatalf("canonical body %s: %v", req.Body, err)
	}
	return body
}

func jsonOf(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

// TestFromAnthropicMessages: each Messages API field becomes what the
// canonical OpenAI chat body (and OllamaFields) carries for it (Anthropic
// API reference, "Messages"; FromAnthropicMessages' table).
func TestFromAnthropicMessages(t *testing.T) {
	in := `{"model":"m","max_tokens":2000,"stream":true,
	 "system":[{"type":"text","text":"be brief"},{"type":"text","text":"be kind","cache_control":{"type":"ephemeral"}}],
	 "messages":[
	  {"role":"user","content":"hi"},
	  {"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"let me look"},
	    {"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Paris"}}]},
	  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},
	    {"type":"tool_result","tool_use_id":"toolu_2","content":"boom","is_error":true},
	    {"type":"text","text":"and?"},
	    {"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}},
	    {"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]}],
	 "tools":[{"name":"get_weather","description":"weather","input_schema":{"type":"object"}}],
	 "tool_choice":{"type":"any","disable_parallel_tool_use":true},
	 "stop_sequences":["END"],"temperature":0.5,"top_p":0.9,"top_k":40,
	 "thinking":{"type":"enabled","budget_tokens":1024},"metadata":{"user_id":"u1"}}`
	req, err := FromAnthropicMessages([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := jsonOf(t, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":2000,
	 "temperature":0.5,"top_p":0.9,"stop":["END"],"user":"u1","tool_choice":"required",
	 "tools":[{"type":"function","function":{"name":"get_weather","description":"weather","parameters":{"type":"object"}}}],
	 "messages":[
	  {"role":"system","content":"be brief\n\nbe kind"},
	  {"role":"user","content":"hi"},
	  {"role":"assistant","content":"let me look","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
	  {"role":"tool","tool_call_id":"toolu_1","content":"sunny"},
	  {"role":"tool","tool_call_id":"toolu_2","content":"Error: boom"},
	  {"role":"user","content":[{"type":"text","text":"and?"},
	    {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},
	    {"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`)
	if got := canonicalOf(t, req); !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Errorf("canonical body\n got %s\nwant %s", g, w)
	}
	if !req.Stream || req.MaxTokens != 2000 || !req.Thinking || !req.Tools || !req.ToolChoiceAny || !req.OneToolCall ||
		!req.Vision || !req.RemoteImages || !reflect.DeepEqual(req.StopSequences, []string{"END"}) {
		t.Errorf("request %+v", req)
	}
	if got := jsonOf(t, string(req.OllamaFields)); !reflect.DeepEqual(got, jsonOf(t, `{"think":true,"options":{"top_k":40}}`)) {
		t.Errorf("OllamaFields %s", req.OllamaFields)
	}
	if !reflect.DeepEqual(req.Extension, []string{"options.top_k", "think"}) {
		t.Errorf("Extension %q", req.Extension)
	}
	// The OllamaFields reach an Ollama provider's body.
	fields, err := ParseOllamaFields(req.OllamaFields)
	if err != nil {
		t.Fatal(err)
	}
	body, err := ToOllamaChat([]byte(`{"messages":[{"role":"user","content":"x"}]}`), "m", fields)
	if err != nil || !strings.Contains(string(body), `"think":true`) || !strings.Contains(string(body), `"top_k":40`) {
		t.Errorf("Ollama body %s, %v", body, err)
	}
}

// TestFromAnthropicMessagesDefaults: a plain request: no stream (the
// client's default), thinking off for Ollama providers (Anthropic's
// default), no tools, the estimate as the edge counts a chat (characters
// / 4, rounded up).
func TestFromAnthropicMessagesDefaults(t *testing.T) {
	req, err := FromAnthropicMessages([]byte(`{"model":"m","max_tokens":1,"system":"abcd","messages":[{"role":"user","content":"efgh1"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if req.Stream || req.Thinking || req.Tools || req.Vision || req.OneToolCall {
		t.Errorf("request %+v", req)
	}
	if string(req.OllamaFields) != `{"think":false}` {
		t.Errorf("OllamaFields %s, want think false", req.OllamaFields)
	}
	if req.EstimatedInputTokens != 3 { // 9 characters
		t.Errorf("EstimatedInputTokens %d, want 3", req.EstimatedInputTokens)
	}
	body := canonicalOf(t, req)
	if body["stream"] != true || body["tool_choice"] != nil || body["max_tokens"] != 1.0 {
		t.Errorf("canonical body %s", req.Body)
	}
}

// TestFromAnthropicToolChoice: auto, none and a named tool.
func TestFromAnthropicToolChoice(t *testing.T) {
	tools := `"tools":[{"name":"a","input_schema":{"type":"object"}},{"name":"b","input_schema":{"type":"object"}}]`
	for choice, want := range map[string]string{
		`{"type":"auto"}`:            `"auto"`,
		`{"type":"none"}`:            `"none"`,
		`{"type":"tool","name":"b"}`: `{"type":"function","function":{"name":"b"}}`,
	} {
		req, err := FromAnthropicMessages([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],` + tools + `,"tool_choice":` + choice + `}`))
		if err != nil {
			t.Fatalf("%s: %v", choice, err)
		}
		if got := canonicalOf(t, req)["tool_choice"]; !reflect.DeepEqual(got, jsonOf(t, want)) {
			t.Errorf("%s: tool_choice %v, want %s", choice, got, want)
		}
		if req.ToolChoiceAny || req.OneToolCall {
			t.Errorf("%s: %+v", choice, req)
		}
	}
}

// TestFromAnthropicMessagesErrors: what Anthropic refuses 400, and what
// iop cannot serve, is a *FieldError naming the field.
func TestFromAnthropicMessagesErrors(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct{ body, field string }{
		{`[]`, ""},
		{`not json`, ""},
		{`{"max_tokens":5,` + msgs + `}`, "model"},
		{`{"model":"m",` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":0,` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":-3,` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":1.5,` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":"5",` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":5}`, "messages"},
		{`{"model":"m","max_tokens":5,"messages":[]}`, "messages"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, "messages[0].role"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user"}]}`, "messages[0].content"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, "messages[0].content[0].type"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]}`, "messages[0].content[0].type"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"image","source":{"type":"url","url":"x"}}]}]}`, "messages[0].content[0].type"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "messages[0].content[0].source.type"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"!!"}}]}]}`, "messages[0].content[0].source.data"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"data:image/png;base64,aGk="}}]}]}`, "messages[0].content[0].source.data"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image","source":{}}]}]}]}`, "messages[0].content[0].content[0]"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","content":"x"}]}]}`, "messages[0].content[0].tool_use_id"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"b","input":[1]}]}]}`, "messages[0].content[0].input"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools[0].type"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tools":[{"type":"bash_20250124","name":"bash"}]}`, "tools[0].type"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tools":[{"type":"text_editor_20250728","name":"str_replace_based_edit_tool"}]}`, "tools[0].type"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tools":[{"type":"computer_20250124","name":"computer"}]}`, "tools[0].type"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tools":[{"input_schema":{}}]}`, "tools[0].name"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tools":[{"name":"a"}]}`, "tools[0].input_schema"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tool_choice":{"type":"any"}}`, "tool_choice"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tools":[{"name":"a","input_schema":{}}],"tool_choice":{"type":"tool","name":"z"}}`, "tool_choice.name"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"tool_choice":{"type":"sometimes"}}`, "tool_choice.type"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"stop_sequences":["a","b","c","d","e"]}`, "stop_sequences"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"stop_sequences":"a"}`, "stop_sequences"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"temperature":"hot"}`, "temperature"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"top_k":1.5}`, "top_k"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"thinking":{"type":"enabled"}}`, "thinking.budget_tokens"},
		{`{"model":"m","max_tokens":5000,` + msgs + `,"thinking":{"type":"enabled","budget_tokens":100}}`, "thinking.budget_tokens"},
		{`{"model":"m","max_tokens":2000,` + msgs + `,"thinking":{"type":"enabled","budget_tokens":2000}}`, "thinking.budget_tokens"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"thinking":{"type":"maybe"}}`, "thinking.type"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"metadata":"u"}`, "metadata"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"system":[{"type":"image"}]}`, "system[0]"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"stream":"yes"}`, "stream"},
	} {
		_, err := FromAnthropicMessages([]byte(tc.body))
		var fe *FieldError
		if !errors.As(err, &fe) {
			t.Errorf("%s: error %v, want a *FieldError", tc.body, err)
			continue
		}
		if fe.Field != tc.field {
			t.Errorf("%s: field %q (%v), want %q", tc.body, fe.Field, err, tc.field)
		}
	}
}

// TestFromAnthropicCountTokens: count_tokens takes a body without
// max_tokens, and counts it as a create counts it.
func TestFromAnthropicCountTokens(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"what is the weather in Paris?"}],"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]}`
	counted, err := FromAnthropicCountTokens([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	created, err := FromAnthropicMessages([]byte(strings.Replace(body, `{"model":"m",`, `{"model":"m","max_tokens":9,`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if counted.EstimatedInputTokens == 0 || counted.EstimatedInputTokens != created.EstimatedInputTokens {
		t.Errorf("count_tokens %d, create %d", counted.EstimatedInputTokens, created.EstimatedInputTokens)
	}
	if _, err := FromAnthropicCountTokens([]byte(`{"model":"m","messages":[]}`)); err == nil {
		t.Error("count_tokens without messages accepted")
	}
}

// FuzzFromAnthropicMessages translates arbitrary Messages bodies: no
// panic, a rejection is a *FieldError, an accepted body has a canonical
// chat body that streams and OllamaFields an Ollama body takes.
func FuzzFromAnthropicMessages(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"aGk="}}]}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r","is_error":true}]}],"tools":[{"name":"n","input_schema":{}}],"tool_choice":{"type":"tool","name":"n"}}`,
		`{"model":"m","max_tokens":2048,"thinking":{"type":"enabled","budget_tokens":1024},"top_k":3,"stop_sequences":["x"],"metadata":{"user_id":"u"},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","max_tokens":null,"messages":null}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text"}]}]}]}`,
		`{}`, `null`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		req, err := FromAnthropicMessages(in)
		if err != nil {
			if _, ok := errors.AsType[*FieldError](err); !ok {
				t.Fatalf("%q: error %T %v, want a *FieldError", in, err, err)
			}
			return
		}
		checkCanonical(t, in, Request{Model: req.Model, Body: req.Body, OllamaFields: req.OllamaFields})
		if req.MaxTokens < 1 || req.EstimatedInputTokens < 0 {
			t.Fatalf("%q: %+v", in, req)
		}
	})
}

// TestRegression_AnthropicValidationAsTheReference: what iop
// accepted, or refused naming the wrong field, that Anthropic's
// reference refuses: an image media_type other than image/jpeg, png, gif
// or webp (or none); temperature or top_p outside [0, 1]; max_tokens
// above what iop passes on (2147483647: it was cut silently); base64
// data with bad padding ("aGVsbG8" was refused by an Ollama provider's
// node naming messages[0].content[0].image_url, and sent as it was to an
// OpenAI-compatible one); an image URL that is not http(s) (file://);
// content [] in a message (refused by the edge as "messages must not be
// empty", naming no message). Each is now a *FieldError naming the
// field; the values at the bounds are taken.
func TestRegression_AnthropicValidationAsTheReference(t *testing.T) {
	image := func(src string) string {
		return `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":` + src + `}]}]}`
	}
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, tc := range []struct{ body, field string }{
		{image(`{"type":"base64","media_type":"text/plain","data":"aGk="}`), "messages[0].content[0].source.media_type"},
		{image(`{"type":"base64","media_type":"image/svg+xml","data":"aGk="}`), "messages[0].content[0].source.media_type"},
		{image(`{"type":"base64","data":"aGk="}`), "messages[0].content[0].source.media_type"},
		{image(`{"type":"base64","media_type":"image/png","data":"aGVsbG8"}`), "messages[0].content[0].source.data"},
		{image(`{"type":"base64","media_type":"image/png","data":"aGVsbG8=="}`), "messages[0].content[0].source.data"},
		{image(`{"type":"url","url":"file:///etc/passwd"}`), "messages[0].content[0].source.url"},
		{image(`{"type":"url","url":"ftp://x/y.png"}`), "messages[0].content[0].source.url"},
		{image(`{"type":"url","url":"y.png"}`), "messages[0].content[0].source.url"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"temperature":1.5}`, "temperature"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"temperature":-0.1}`, "temperature"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"top_p":7}`, "top_p"},
		{`{"model":"m","max_tokens":5,` + msgs + `,"top_p":-1}`, "top_p"},
		{`{"model":"m","max_tokens":2147483648,` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":1e12,` + msgs + `}`, "max_tokens"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[]}]}`, "messages[0].content"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":""}]}`, "messages[0].content"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[]},{"role":"user","content":"y"}]}`, "messages[1].content"},
	} {
		_, err := FromAnthropicMessages([]byte(tc.body))
		fe, ok := errors.AsType[*FieldError](err)
		if !ok || fe.Field != tc.field {
			t.Errorf("%s: error %v, want a *FieldError naming %s", tc.body, err, tc.field)
		}
	}
	for _, body := range []string{
		image(`{"type":"base64","media_type":"image/jpeg","data":"aGVsbG8="}`),
		image(`{"type":"base64","media_type":"image/gif","data":"aGk="}`),
		image(`{"type":"base64","media_type":"image/webp","data":"aGk="}`),
		image(`{"type":"url","url":"HTTPS://x/y.png"}`),
		`{"model":"m","max_tokens":2147483647,` + msgs + `,"temperature":0,"top_p":1}`,
		`{"model":"m","max_tokens":5,` + msgs + `,"temperature":1,"top_p":0}`,
		// Anthropic's exception: the last message may be an empty assistant one.
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[]}]}`,
	} {
		if _, err := FromAnthropicMessages([]byte(body)); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
	req, err := FromAnthropicMessages([]byte(image(`{"type":"base64","media_type":"image/webp","data":"aGk="}`)))
	if err != nil || !strings.Contains(string(req.Body), `"url":"data:image/webp;base64,aGk="`) {
		t.Errorf("%v: body %s", err, req.Body)
	}
}
