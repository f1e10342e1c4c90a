package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"unicode/utf8"
)

func TestDecodeChatRequest(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		body      string
		want      chatRequest
		wantParam string // when an error is wanted; "-" for a whole-body error
	}{
		{name: "minimal", body: `{"model":"m","messages":[{"role":"user","content":"abcde"}]}`,
			want: chatRequest{Model: "m", EstimatedInputTokens: 2}},
		{name: "stream with usage", body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":""}]}`,
			want: chatRequest{Model: "m", Stream: true, IncludeUsage: true}},
		{name: "nulls are absent", body: `{"model":"m","stream":null,"stream_options":null,"max_tokens":null,"tools":null,"messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`,
			want: chatRequest{Model: "m"}},
		{name: "unknown fields pass", body: `{"model":"m","x-vendor":{"a":[1,2]},"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"hi","name":"bob"}]}`,
			want: chatRequest{Model: "m", EstimatedInputTokens: 1}},
		// The estimate counts the function definition's JSON (12 characters).
		{name: "legacy functions need tools", body: `{"model":"m","functions":[{"name":"f"}],"messages":[{"role":"user","content":"x"}]}`,
			want: chatRequest{Model: "m", Needs: []string{"tools"}, EstimatedInputTokens: 4}},
		{name: "tool calls count names and arguments", body: `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"fn","arguments":"{\"a\":1}"}}]}]}`,
			want: chatRequest{Model: "m", EstimatedInputTokens: 3}}, // "fn" and {"a":1}: 9 characters
		{name: "tools count without space", body: `{"model":"m","tools":[ { "type" : "function" , "function" : { "name" : "f" } } ],"messages":[{"role":"user","content":""}]}`,
			want: chatRequest{Model: "m", Needs: []string{"tools"}, EstimatedInputTokens: 11}}, // {"type":"function","function":{"name":"f"}}: 43 characters
		{name: "tool call type may be absent", body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}]}`,
			want: chatRequest{Model: "m", EstimatedInputTokens: 1}},
		{name: "legacy function role", body: `{"model":"m","messages":[{"role":"developer","content":"x"},{"role":"function","name":"f","content":"y"}]}`,
			want: chatRequest{Model: "m", EstimatedInputTokens: 1}},
		{name: "keys are case-sensitive", body: `{"Model":"m","model":"n","messages":[{"role":"user","content":"x"}]}`,
			want: chatRequest{Model: "n", EstimatedInputTokens: 1}},
		{name: "last duplicate wins", body: `{"model":1,"model":"m","messages":[{"role":"user","content":"x"}]}`,
			want: chatRequest{Model: "m", EstimatedInputTokens: 1}},
		{name: "image in a later message", body: `{"model":"m","messages":[{"role":"user","content":"x"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"u"}}]}]}`,
			want: chatRequest{Model: "m", Needs: []string{"vision"}, EstimatedInputTokens: 1}},

		{name: "missing role", body: `{"model":"m","messages":[{"content":"x"}]}`, wantParam: "messages[0].role"},
		{name: "unknown role", body: `{"model":"m","messages":[{"role":"User","content":"x"}]}`, wantParam: "messages[0].role"},
		{name: "tool call function null", body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":null}]}]}`, wantParam: "messages[0].tool_calls[0].function"},
		{name: "tool call type a number", body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"type":1,"function":{"name":"f"}}]}]}`, wantParam: "messages[0].tool_calls[0].type"},
		{name: "tool call name null", body: `{"model":"m","messages":[{"role":"assistant","tool_calls":[{"function":{"name":null,"arguments":"{}"}}]}]}`, wantParam: "messages[0].tool_calls[0].function.name"},
		{name: "json_schema null", body: `{"model":"m","response_format":{"type":"json_schema","json_schema":null},"messages":[{"role":"user","content":"x"}]}`, wantParam: "response_format.json_schema"},
		{name: "part without type", body: `{"model":"m","messages":[{"role":"user","content":[{"text":"x"}]}]}`, wantParam: "messages[0].content[0].type"},
		{name: "part not an object", body: `{"model":"m","messages":[{"role":"user","content":["x"]}]}`, wantParam: "messages[0].content[0]"},
		{name: "null message", body: `{"model":"m","messages":[null]}`, wantParam: "messages[0]"},
		{name: "content an object", body: `{"model":"m","messages":[{"role":"user","content":{"text":"x"}}]}`, wantParam: "messages[0].content"},
		{name: "stream_options not an object", body: `{"model":"m","stream_options":true,"messages":[{"role":"user","content":"x"}]}`, wantParam: "stream_options"},
		{name: "n a string", body: `{"model":"m","n":"2","messages":[{"role":"user","content":"x"}]}`, wantParam: "n"},
		{name: "a string body", body: `"hello"`, wantParam: "-"},
		// Was accepted and forwarded until providers were found to reject it
		// after the queue wait; see TestRegression_ProviderRejectedValuesCaughtAtAPI.
		{name: "other part types", body: `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}},{"type":"text","text":"abcd"}]}]}`,
			wantParam: "messages[0].content[0].type"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := decodeChatRequest([]byte(tt.body))
			if tt.wantParam != "" {
				var reqErr *FieldError
				if !errors.As(err, &reqErr) {
					t.Fatalf("err = %v, want a *FieldError", err)
				}
				if param := reqErr.Field; param != tt.wantParam && !(tt.wantParam == "-" && param == "") {
					t.Errorf("param = %q, want %q (%v)", param, tt.wantParam, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Model != tt.want.Model || got.Stream != tt.want.Stream || got.IncludeUsage != tt.want.IncludeUsage ||
				!slices.Equal(got.Needs, tt.want.Needs) || got.EstimatedInputTokens != tt.want.EstimatedInputTokens {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// FuzzDecodeChatRequest feeds the decoder arbitrary client bodies. Corpus:
// testdata/fuzz/FuzzDecodeChatRequest. It must never panic; an accepted body
// must be a JSON object with a model whose checked fields a provider can
// read (acceptedFieldsOK), and a rejected one must yield a *FieldError
// whose text (the OpenAI error body's message) is short and valid UTF-8.
func FuzzDecodeChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"model":"m","messages":"x"}`,
		`{"model":"","messages":[]}`,
		`[]`,
		`{`,
		`{"model":"m","n":2,"max_tokens":0,"temperature":1e400,"stop":5,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","n":1,"max_tokens":1,"seed":-1,"stop":["a"],"response_format":{"type":"json_schema","json_schema":{"name":"s"}},"messages":[{"role":"assistant","name":"a","tool_calls":[{"function":{"name":"f"}}]}]}`,
		`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false,
		  "reasoning_effort":"high","reasoning":{"effort":"low","enabled":true},"messages":[{"role":"developer","content":[{"type":"image_url","image_url":"https://x/y.png"}]}]}`,
		`{"model":"m","tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"required"}},"messages":[{"role":"user","content":"x"}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := decodeChatRequest(body)
		if err != nil {
			var reqErr *FieldError
			if !errors.As(err, &reqErr) || reqErr.Message == "" {
				t.Fatalf("err = %#v, want a *FieldError with a message", err)
			}
			// The frame answers it 400 with this text as the message
			// (TestClassifyFieldError): one quoted client value (clipped,
			// maybe escaped) and some words.
			if msg := reqErr.Error(); len(msg) > 4*MaxQuotedBytes+256 || !utf8.ValidString(msg) {
				t.Fatalf("message of %d bytes (valid UTF-8: %v): %.300q", len(msg), utf8.ValidString(msg), msg)
			}
			return
		}
		var top map[string]json.RawMessage
		if json.Unmarshal(body, &top) != nil || top == nil {
			t.Fatalf("accepted a body that is not a JSON object: %q", body)
		}
		if got.Model == "" {
			t.Fatal("accepted an empty model")
		}
		if err := acceptedFieldsOK(top); err != nil {
			t.Fatalf("accepted %q: %v", body, err)
		}
		if got.EstimatedInputTokens < 0 || got.EstimatedInputTokens > len(body) {
			t.Fatalf("EstimatedInputTokens = %d for a %d-byte body", got.EstimatedInputTokens, len(body))
		}
		seen := map[string]bool{}
		for _, n := range got.Needs {
			if !slices.Contains([]string{NeedTools, NeedToolChoice, NeedThinking, NeedVision, NeedRemoteImages, NeedChoices}, n) || seen[n] {
				t.Fatalf("Needs = %v", got.Needs)
			}
			seen[n] = true
		}
		again, err := decodeChatRequest(body)
		if err != nil || again.Model != got.Model || !slices.Equal(again.Needs, got.Needs) {
			t.Fatalf("decoding is not deterministic: %+v then %+v, %v", got, again, err)
		}
	})
}

// acceptedFieldsOK checks, independently of the decoder, the checked fields
// of a body it accepted: what a provider decoding them into Go types, with
// OpenAI's limits, would accept.
func acceptedFieldsOK(top map[string]json.RawMessage) error {
	present := func(name string) (json.RawMessage, bool) {
		raw, ok := top[name]
		return raw, ok && string(bytes.TrimSpace(raw)) != "null"
	}
	if raw, ok := present("n"); ok {
		var n int32
		if json.Unmarshal(raw, &n) != nil || n < 1 || n > 128 {
			return fmt.Errorf("n = %s", raw)
		}
	}
	for _, name := range []string{"max_tokens", "max_completion_tokens"} {
		var v int32
		if raw, ok := present(name); ok && (json.Unmarshal(raw, &v) != nil || v < 1) {
			return fmt.Errorf("%s = %s", name, raw)
		}
	}
	var seed int64
	if raw, ok := present("seed"); ok && json.Unmarshal(raw, &seed) != nil {
		return fmt.Errorf("seed = %s", raw)
	}
	for _, name := range []string{"temperature", "top_p", "presence_penalty", "frequency_penalty"} {
		var f float64
		if raw, ok := present(name); ok && json.Unmarshal(raw, &f) != nil {
			return fmt.Errorf("%s = %s", name, raw)
		}
	}
	if raw, ok := present("stop"); ok {
		var one string
		var many []json.RawMessage
		if json.Unmarshal(raw, &one) != nil {
			if json.Unmarshal(raw, &many) != nil || len(many) > 4 {
				return fmt.Errorf("stop = %s", raw)
			}
			for _, s := range many {
				if firstByte(s) != '"' {
					return fmt.Errorf("stop = %s", raw)
				}
			}
		}
	}
	if raw, ok := present("response_format"); ok {
		var rf map[string]json.RawMessage // not a struct: keys match exactly
		var typ string
		if json.Unmarshal(raw, &rf) != nil || json.Unmarshal(rf["type"], &typ) != nil ||
			!slices.Contains(responseFormatTypes, typ) {
			return fmt.Errorf("response_format = %s", raw)
		}
		if typ == "json_schema" {
			// OpenAI's shape: {"name": string, "schema"?: object}.
			var js, schema map[string]json.RawMessage
			var name *string
			if json.Unmarshal(rf["json_schema"], &js) != nil || js == nil ||
				json.Unmarshal(js["name"], &name) != nil || name == nil ||
				(js["schema"] != nil && json.Unmarshal(js["schema"], &schema) != nil) {
				return fmt.Errorf("response_format = %s", raw)
			}
		}
	}
	var messages []map[string]json.RawMessage
	if err := json.Unmarshal(top["messages"], &messages); err != nil {
		return fmt.Errorf("messages: %v", err)
	}
	for i, msg := range messages {
		var role, name string
		var toolCalls []map[string]json.RawMessage // not structs: keys match exactly
		var parts []map[string]json.RawMessage
		if json.Unmarshal(msg["role"], &role) != nil ||
			!slices.Contains([]string{"system", "user", "assistant", "tool", "developer", "function"}, role) {
			return fmt.Errorf("messages[%d].role = %s", i, msg["role"])
		}
		if raw, ok := msg["name"]; ok && json.Unmarshal(raw, &name) != nil {
			return fmt.Errorf("messages[%d].name = %s", i, raw)
		}
		if raw, ok := msg["tool_calls"]; ok && json.Unmarshal(raw, &toolCalls) != nil {
			return fmt.Errorf("messages[%d].tool_calls = %s", i, raw)
		}
		// OpenAI's shape: {"type"?: "function", "function": {"name": string,
		// "arguments"?: string}}; null counts as absent.
		for j, call := range toolCalls {
			var fn map[string]json.RawMessage
			var typ, fnName, args *string
			if json.Unmarshal(call["function"], &fn) != nil || fn == nil ||
				json.Unmarshal(fn["name"], &fnName) != nil || fnName == nil ||
				(call["type"] != nil && (json.Unmarshal(call["type"], &typ) != nil || (typ != nil && *typ != "function"))) ||
				(fn["arguments"] != nil && json.Unmarshal(fn["arguments"], &args) != nil) {
				return fmt.Errorf("messages[%d].tool_calls[%d] = %s", i, j, msg["tool_calls"])
			}
		}
		if raw := msg["content"]; firstByte(raw) == '[' {
			if err := json.Unmarshal(raw, &parts); err != nil {
				return fmt.Errorf("messages[%d].content = %s", i, raw)
			}
			for j, p := range parts {
				var typ string
				if json.Unmarshal(p["type"], &typ) != nil || !slices.Contains(contentPartTypes, typ) {
					return fmt.Errorf("messages[%d].content[%d].type = %s", i, j, p["type"])
				}
			}
		}
	}
	return nil
}

// TestRegression_MalformedToolsAreRefused: chat requests with malformed
// tools were accepted (200) on both paths, where OpenAI answers 400.
// Each is refused 400 naming the field; well-formed
// function and custom tools, and legacy functions, pass.
func TestRegression_MalformedToolsAreRefused(t *testing.T) {
	t.Parallel()
	msgs := `"messages":[{"role":"user","content":"x"}]`
	for tools, param := range map[string]string{
		`"tools":[{}]`:                  "tools[0].type",
		`"tools":[1]`:                   "tools[0]",
		`"tools":[{"type":"function"}]`: "tools[0].function",
		`"tools":[{"type":"function","function":{}}]`:                               "tools[0].function.name",
		`"tools":[{"type":"function","function":"f"}]`:                              "tools[0].function",
		`"tools":[{"type":"function","function":{"name":""}}]`:                      "tools[0].function.name",
		`"tools":[{"type":"function","function":{"name":1}}]`:                       "tools[0].function.name",
		`"tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]`:    "tools[0].function.parameters",
		`"tools":[{"type":"function","function":{"name":"f","description":2}}]`:     "tools[0].function.description",
		`"tools":[{"type":"function","function":{"name":"f","strict":"yes"}}]`:      "tools[0].function.strict",
		`"tools":[{"type":"retrieval"}]`:                                            "tools[0].type",
		`"tools":[{"type":"custom"}]`:                                               "tools[0].custom",
		`"tools":[{"type":"function","function":{"name":"f"}},{"type":"function"}]`: "tools[1].function",
		`"functions":[{"parameters":{}}]`:                                           "functions[0].name",
	} {
		body := `{"model":"m",` + tools + `,` + msgs + `}`
		_, err := decodeChatRequest([]byte(body))
		var re *FieldError
		if !errors.As(err, &re) || re.Field != param {
			t.Errorf("%s: %v, want a 400 naming %s", tools, err, param)
		}
	}
	for _, tools := range []string{
		`"tools":[{"type":"function","function":{"name":"get weather.now","description":"d","parameters":{"type":"object"},"strict":true}}]`,
		`"tools":[{"type":"custom","custom":{"name":"grammar"}}]`,
		`"tools":[]`,
		`"functions":[{"name":"f","parameters":{}}]`,
	} {
		if _, err := decodeChatRequest([]byte(`{"model":"m",` + tools + `,` + msgs + `}`)); err != nil {
			t.Errorf("%s: %v, want it accepted", tools, err)
		}
	}
}
