package translate

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestRegression_ForcedToolChoiceOnOllama: tool_choice "required" was
// refused and a named function ignored on the way to Ollama, which has no
// tool_choice. Each forced form now reaches Ollama as a format that admits
// only the call, without tools, and the answer's text reads back as it.
func TestRegression_ForcedToolChoiceOnOllama(t *testing.T) {
	const (
		weather = `{"type":"function","function":{"name":"weather","description":"the weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`
		clock   = `{"type":"function","function":{"name":"clock"}}`
		user    = `"messages":[{"role":"user","content":"Paris?"}]`
	)
	for _, tc := range []struct {
		name, body string
		names      []string
		format     string
	}{
		{"a named function", `{` + user + `,"tools":[` + weather + `,` + clock + `],"tool_choice":{"type":"function","function":{"name":"weather"}}}`,
			[]string{"weather"}, `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`},
		{"required with one tool", `{` + user + `,"tools":[` + clock + `],"tool_choice":"required","parallel_tool_calls":false}`,
			[]string{"clock"}, `{"type":"object"}`},
		{"required with several", `{` + user + `,"tools":[` + weather + `,` + clock + `],"tool_choice":"required"}`,
			[]string{"weather", "clock"}, `{"anyOf":[{"type":"object","properties":{"name":{"const":"weather"},"arguments":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}},"required":["name","arguments"]},{"type":"object","properties":{"name":{"const":"clock"},"arguments":{"type":"object"}},"required":["name","arguments"]}]}`},
		{"allowed tools required", `{` + user + `,"tools":[` + weather + `,` + clock + `],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"clock"}}]}}}`,
			[]string{"clock"}, `{"type":"object"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ToOllamaChatRequest([]byte(tc.body), "m", nil)
			if err != nil {
				t.Fatal(err)
			}
			var body struct {
				Tools    json.RawMessage `json:"tools"`
				Format   json.RawMessage `json:"format"`
				Messages []ollamaMessage `json:"messages"`
			}
			if err := json.Unmarshal(got.Body, &body); err != nil {
				t.Fatal(err)
			}
			if got.Forced == nil || !slices.Equal(got.Forced.Names, tc.names) {
				t.Fatalf("forced %+v, want %q", got.Forced, tc.names)
			}
			if body.Tools != nil || !jsonEqual(t, body.Format, tc.format) {
				t.Fatalf("tools %s format %s, want no tools and format %s", body.Tools, body.Format, tc.format)
			}
			if last := body.Messages[len(body.Messages)-1]; len(body.Messages) != 2 || last.Role != "system" {
				t.Fatalf("messages %+v, want the conversation and a system message naming the tools", body.Messages)
			}
		})
	}
}

func TestForcedCallReadsTheAnswer(t *testing.T) {
	one := &ForcedCall{Names: []string{"weather"}}
	if n, a, err := one.Call(` {"city":"Paris"} `); n != "weather" || a != `{"city":"Paris"}` || err != nil {
		t.Fatalf("one: %q %q %v", n, a, err)
	}
	if n, a, err := one.Call(""); n != "weather" || a != "{}" || err != nil {
		t.Fatalf("empty: %q %q %v", n, a, err)
	}
	several := &ForcedCall{Names: []string{"weather", "clock"}}
	if n, a, err := several.Call(`{"name":"clock","arguments":{"tz": "UTC"}}`); n != "clock" || a != `{"tz":"UTC"}` || err != nil {
		t.Fatalf("several: %q %q %v", n, a, err)
	}
	if n, a, err := several.Call(`{"name":"clock"}`); n != "clock" || a != "{}" || err != nil {
		t.Fatalf("no arguments: %q %q %v", n, a, err)
	}
	for _, bad := range []string{`{"name":"other","arguments":{}}`, `not json`, `{"arguments":{}}`} {
		if _, _, err := several.Call(bad); err == nil {
			t.Fatalf("%s: no error", bad)
		}
	}
}

// TestRegression_ForcedCustomToolOnOllama: tool_choice "required" with a
// custom tool among the tools reached Ollama as a forced call of a tool
// with no name, and the answer came back as a nameless call with
// arguments "{}". Only function tools can be forced on Ollama: such a
// request is refused as {"type":"custom"} is.
func TestRegression_ForcedCustomToolOnOllama(t *testing.T) {
	const (
		custom = `{"type":"custom","custom":{"name":"c"}}`
		fn     = `{"type":"function","function":{"name":"a"}}`
		user   = `"messages":[{"role":"user","content":"hi"}]`
	)
	for _, tools := range []string{custom, fn + `,` + custom, custom + `,` + fn} {
		body := `{` + user + `,"tools":[` + tools + `],"tool_choice":"required"}`
		got, err := ToOllamaChatRequest([]byte(body), "m", nil)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "tool_choice" || !strings.Contains(fe.Message, `"custom"`) {
			t.Fatalf("%s: forced %+v, error %v; want a *FieldError naming tool_choice and the custom tool", body, got.Forced, err)
		}
	}
	// A function tool forced by name beside a custom one is served.
	body := `{` + user + `,"tools":[` + fn + `,` + custom + `],"tool_choice":{"type":"function","function":{"name":"a"}}}`
	got, err := ToOllamaChatRequest([]byte(body), "m", nil)
	if err != nil || got.Forced == nil || !slices.Equal(got.Forced.Names, []string{"a"}) {
		t.Fatalf("named function beside a custom tool: forced %+v, error %v", got.Forced, err)
	}
}

// TestRegression_AllowedToolsRequiredEmpty: allowed tools of mode
// "required" with an empty list were refused with "the request has no
// function tools" though the request had some; the error now names the
// empty allowed list.
func TestRegression_AllowedToolsRequiredEmpty(t *testing.T) {
	for _, list := range []string{`[]`, `[{"type":"custom","custom":{"name":"c"}}]`} {
		body := `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"a"}}],"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":` + list + `}}}`
		_, err := ToOllamaChatRequest([]byte(body), "m", nil)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "tool_choice.allowed_tools.tools" || strings.Contains(fe.Message, "no function tools") {
			t.Fatalf("allowed tools %s: error %v; want a *FieldError naming tool_choice.allowed_tools.tools", list, err)
		}
	}
}
