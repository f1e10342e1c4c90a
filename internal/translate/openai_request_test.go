package translate

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestToOllamaChat(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		{
			name: "minimal",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"llama3.2:3b","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		},
		{
			name: "max_tokens, stop list, json schema",
			body: `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stop":["a","b"],
				"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}`,
			want: `{"model":"llama3.2:3b","stream":true,"messages":[{"role":"user","content":"hi"}],
				"options":{"num_predict":5,"stop":["a","b"]},"format":{"type":"object"}}`,
		},
		{
			name: "tool message named directly, text response format",
			body: `{"messages":[{"role":"tool","name":"f","content":"42"}],"response_format":{"type":"text"},"tools":null}`,
			want: `{"model":"llama3.2:3b","stream":true,"messages":[{"role":"tool","content":"42","tool_name":"f"}]}`,
		},
		{
			name: "tool call answered by id, empty arguments",
			body: `{"messages":[{"role":"assistant","tool_calls":[{"id":"c1","function":{"name":"now","arguments":""}}]},
				{"role":"tool","tool_call_id":"c1","content":"noon"}],"max_completion_tokens":3,"max_tokens":9,"temperature":0}`,
			want: `{"model":"llama3.2:3b","stream":true,"options":{"num_predict":3,"temperature":0},"messages":[
				{"role":"assistant","content":"","tool_calls":[{"function":{"name":"now","arguments":{}}}]},
				{"role":"tool","content":"noon","tool_name":"now"}]}`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ToOllamaChat([]byte(tc.body), "llama3.2:3b", nil)
			if err != nil {
				t.Fatal(err)
			}
			if !jsonEqual(t, got, tc.want) {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// toolF and toolG are function tools of a request.
const (
	toolF = `{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}`
	toolG = `{"type":"function","function":{"name":"g"}}`
)

func TestToOllamaChatReasoningRolesAndTools(t *testing.T) {
	user := `"messages":[{"role":"user","content":"hi"}]`
	fieldsOf := map[string]string{ // the cases' OllamaFields, by name
		"the fields' think wins over reasoning_effort": `{"think":true}`,
	}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"reasoning_effort level", `{` + user + `,"reasoning_effort":"high"}`,
			`{"model":"m","stream":true,` + user + `,"think":"high"}`},
		{"reasoning_effort none is think false", `{` + user + `,"reasoning_effort":"none"}`,
			`{"model":"m","stream":true,` + user + `,"think":false}`},
		{"minimal is low, Ollama's lowest", `{` + user + `,"reasoning_effort":"minimal"}`,
			`{"model":"m","stream":true,` + user + `,"think":"low"}`},
		{"xhigh is high", `{` + user + `,"reasoning_effort":"xhigh"}`,
			`{"model":"m","stream":true,` + user + `,"think":"high"}`},
		{"reasoning.effort wins, as in Ollama's own OpenAI API", `{` + user + `,"reasoning_effort":"low","reasoning":{"effort":"none"}}`,
			`{"model":"m","stream":true,` + user + `,"think":false}`},
		{"OpenRouter's reasoning.enabled", `{` + user + `,"reasoning":{"enabled":true}}`,
			`{"model":"m","stream":true,` + user + `,"think":true}`},
		{"no reasoning setting: Ollama's default", `{` + user + `}`,
			`{"model":"m","stream":true,` + user + `}`},
		{"the fields' think wins over reasoning_effort", `{` + user + `,"reasoning_effort":"medium"}`,
			`{"model":"m","stream":true,` + user + `,"think":true}`},
		{"a body's own iop_ollama member is not fields", `{` + user + `,"reasoning_effort":"medium","iop_ollama":{"think":true,"keep_alive":"1h"}}`,
			`{"model":"m","stream":true,` + user + `,"think":"medium"}`},
		{"developer is system; an earlier answer's reasoning is thinking",
			`{"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":"hi"},
				{"role":"assistant","content":"a","reasoning_content":"first"},{"role":"assistant","content":"b","reasoning":"second"},
				{"role":"assistant","content":"c","reasoning":{"x":1}}]}`,
			`{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"},
				{"role":"assistant","content":"a","thinking":"first"},{"role":"assistant","content":"b","thinking":"second"},
				{"role":"assistant","content":"c"}]}`},
		{"tool_choice auto", `{` + user + `,"tools":[` + toolF + `,` + toolG + `],"tool_choice":"auto","parallel_tool_calls":true}`,
			`{"model":"m","stream":true,` + user + `,"tools":[` + toolF + `,` + toolG + `]}`},
		{"tool_choice none sends no tools", `{` + user + `,"tools":[` + toolF + `,` + toolG + `],"tool_choice":"none"}`,
			`{"model":"m","stream":true,` + user + `}`},
		{"allowed tools in mode auto", `{` + user + `,"tools":[` + toolF + `,` + toolG + `],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"f"}}]}}}`,
			`{"model":"m","stream":true,` + user + `,"tools":[` + toolF + `]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fields, err := ParseOllamaFields([]byte(fieldsOf[tc.name]))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ToOllamaChat([]byte(tc.body), "m", fields)
			if err != nil {
				t.Fatal(err)
			}
			if !jsonEqual(t, got, tc.want) {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
	t.Run("a completion's reasoning_effort", func(t *testing.T) {
		got, err := ToOllamaGenerate([]byte(`{"prompt":"x","reasoning_effort":"low"}`), "m", nil)
		if want := `{"model":"m","prompt":"x","stream":true,"think":"low"}`; err != nil || !jsonEqual(t, got, want) {
			t.Fatalf("%s %v", got, err)
		}
	})
}

func TestToOllamaGenerateAndEmbed(t *testing.T) {
	got, err := ToOllamaGenerate([]byte(`{"prompt":["Why?"],"suffix":"!","max_tokens":7,"stop":"\n","seed":1}`), "m", nil)
	if want := `{"model":"m","prompt":"Why?","suffix":"!","stream":true,"options":{"num_predict":7,"stop":["\n"],"seed":1}}`; err != nil || !jsonEqual(t, got, want) {
		t.Fatalf("generate: %s, %v; want %s", got, err, want)
	}
	got, n, err := ToOllamaEmbed([]byte(`{"input":"one","dimensions":8,"encoding_format":"base64"}`), "e", nil)
	if want := `{"model":"e","input":["one"],"dimensions":8}`; err != nil || n != 1 || !jsonEqual(t, got, want) {
		t.Fatalf("embed: %s, %d, %v; want %s", got, n, err, want)
	}
	if p, err := OpenAIPrompt([]byte(`{"prompt":"only"}`)); p != "only" || err != nil {
		t.Fatalf("OpenAIPrompt: %q, %v", p, err)
	}
}

// Requests an Ollama provider cannot answer as asked fail naming the field.
func TestToOllamaRefusals(t *testing.T) {
	chat := func(b []byte) error { _, err := ToOllamaChat(b, "m", nil); return err }
	generate := func(b []byte) error { _, err := ToOllamaGenerate(b, "m", nil); return err }
	embed := func(b []byte) error { _, _, err := ToOllamaEmbed(b, "m", nil); return err }
	for _, tc := range []struct {
		name  string
		fn    func([]byte) error
		body  string
		field string
	}{
		{"not json", chat, `{`, ""},
		{"no messages", chat, `{"messages":[]}`, "messages"},
		{"no role", chat, `{"messages":[{"content":"x"}]}`, "messages[0]"},
		{"n", chat, `{"n":2,"messages":[{"role":"user","content":"x"}]}`, "n"},
		{"remote image", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}`, "messages[0].content[0].image_url"},
		{"file URL image", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":"file:///etc/passwd"}]}]}`, "messages[0].content[0].image_url"},
		{"tool_choice required without tools", chat, `{"messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`, "tool_choice"},
		{"allowed tools of another mode", chat, `{"messages":[{"role":"user","content":"x"}],"tools":[` + toolF + `],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"some","tools":[` + toolF + `]}}}`, "tool_choice.allowed_tools.mode"},
		{"tool_choice unknown string", chat, `{"messages":[{"role":"user","content":"x"}],"tools":[` + toolF + `],"tool_choice":"any"}`, "tool_choice"},
		{"tool_choice custom", chat, `{"messages":[{"role":"user","content":"x"}],"tools":[` + toolF + `],"tool_choice":{"type":"custom","custom":{"name":"f"}}}`, "tool_choice"},
		{"tool_choice names a missing function", chat, `{"messages":[{"role":"user","content":"x"}],"tools":[` + toolF + `],"tool_choice":{"type":"function","function":{"name":"g"}}}`, "tool_choice"},
		{"parallel_tool_calls false", chat, `{"messages":[{"role":"user","content":"x"}],"tools":[` + toolF + `],"parallel_tool_calls":false}`, "parallel_tool_calls"},
		{"reasoning_effort unknown", chat, `{"messages":[{"role":"user","content":"x"}],"reasoning_effort":"max"}`, "reasoning_effort"},
		{"reasoning.effort unknown", chat, `{"messages":[{"role":"user","content":"x"}],"reasoning":{"effort":"max"}}`, "reasoning.effort"},
		// Invalid base64 must not be answered 200 without the image.
		{"image data not base64", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,!!!"}}]}]}`, "messages[0].content[0].image_url"},
		{"image data cut short", chat, `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo"}}]}]}`, "messages[0].content[0].image_url"},
		{"chat logprobs", chat, `{"messages":[{"role":"user","content":"x"}],"logprobs":true}`, "logprobs"},
		{"chat top_logprobs", chat, `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, "top_logprobs"},
		{"audio part", chat, `{"messages":[{"role":"user","content":[{"type":"input_audio"}]}]}`, "messages[0].content[0]"},
		{"content number", chat, `{"messages":[{"role":"user","content":7}]}`, "messages[0].content"},
		{"bad tool arguments", chat, `{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{"}}]}]}`, "messages[0]"},
		{"bad stop", chat, `{"messages":[{"role":"user","content":"x"}],"stop":3}`, "stop"},
		{"unknown format", chat, `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}`, "response_format"},
		{"schema missing", chat, `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}}`, "response_format"},
		{"two prompts", generate, `{"prompt":["a","b"]}`, "prompt"},
		{"token prompt", generate, `{"prompt":[1,2,3]}`, "prompt"},
		{"echo", generate, `{"prompt":"x","echo":true}`, "echo"},
		{"logprobs", generate, `{"prompt":"x","logprobs":2}`, "logprobs"},
		{"best_of", generate, `{"prompt":"x","best_of":2}`, "best_of"},
		{"n completions", generate, `{"prompt":"x","n":3}`, "n"},
		{"token input", embed, `{"input":[[1,2]]}`, "input"},
		{"no input", embed, `{"input":[]}`, "input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fe *FieldError
			if err := tc.fn([]byte(tc.body)); !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("error %v, want a *FieldError naming %q", err, tc.field)
			}
		})
	}
}

// TestRegression_ToolChoiceNoneStillCallsATool: tool_choice never reached
// an Ollama provider, so "none" still got a tool call. The provider now
// gets no tools.
func TestRegression_ToolChoiceNoneStillCallsATool(t *testing.T) {
	got, err := ToOllamaChat([]byte(`{"messages":[{"role":"user","content":"use f"}],"tools":[`+toolF+`],"tool_choice":"none"}`), "m", nil)
	if err != nil || bytes.Contains(got, []byte(`"tools"`)) {
		t.Fatalf("%s %v: the provider still gets the tools", got, err)
	}
}

// TestRegression_NamedFunctionGetsAnotherOne: a named function used to
// reach an Ollama provider with every tool, and the model called another
// one. The provider now gets no tools but the named one's parameters as
// the format its answer must follow.
func TestRegression_NamedFunctionGetsAnotherOne(t *testing.T) {
	got, err := ToOllamaChatRequest([]byte(`{"messages":[{"role":"user","content":"use f"}],"tools":[`+toolF+`,`+toolG+`],
		"tool_choice":{"type":"function","function":{"name":"g"}}}`), "m", nil)
	if err != nil || got.Forced == nil || !slices.Equal(got.Forced.Names, []string{"g"}) ||
		bytes.Contains(got.Body, []byte(`"tools"`)) || !bytes.Contains(got.Body, []byte(`"format":{"type":"object"}`)) {
		t.Fatalf("%s %+v %v, want g forced through format", got.Body, got.Forced, err)
	}
}

// TestRegression_ToolChoiceRequiredSilentlyDropped: parallel_tool_calls
// false was dropped on the way to Ollama, which cannot honour it without a
// forced call; the translation refuses it, naming the field. ("required"
// is served: TestRegression_ForcedToolChoiceOnOllama.)
func TestRegression_ToolChoiceRequiredSilentlyDropped(t *testing.T) {
	for field, body := range map[string]string{
		"parallel_tool_calls": `{"messages":[{"role":"user","content":"x"}],"tools":[` + toolF + `],"parallel_tool_calls":false}`,
	} {
		var fe *FieldError
		if _, err := ToOllamaChat([]byte(body), "m", nil); !errors.As(err, &fe) || fe.Field != field || !strings.Contains(fe.Message, "cannot be honoured") {
			t.Errorf("%s: %v, want a refusal naming it", field, err)
		}
	}
}
