package request

import (
	"slices"
	"strings"
	"testing"
)

// TestToolChoiceNeeds: tool_choice and parallel_tool_calls are checked,
// and the settings only OpenAI-compatible providers honour
// (parallel_tool_calls false without a forced call) make the request need
// them (so it never silently reaches an Ollama provider); a forced call
// does not (an Ollama provider serves it); remote images need one too.
func TestToolChoiceNeeds(t *testing.T) {
	const tools = `"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}]`
	user := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		fields string
		needs  []string
	}{
		{tools, []string{"tools"}},
		{tools + `,"tool_choice":"auto","parallel_tool_calls":true`, []string{"tools"}},
		{tools + `,"tool_choice":"none"`, []string{"tools"}},
		{tools + `,"tool_choice":{"type":"function","function":{"name":"g"}}`, []string{"tools"}},
		{tools + `,"tool_choice":"required"`, []string{"tools"}},
		{tools + `,"tool_choice":"required","parallel_tool_calls":false`, []string{"tools"}},
		{tools + `,"parallel_tool_calls":false`, []string{"tools", "tool_choice"}},
		{tools + `,"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[]}}`, []string{"tools"}},
		{`"parallel_tool_calls":false`, nil},
		{`"tool_choice":"none"`, nil},
	} {
		body := `{"model":"m",` + user + `,` + c.fields + `}`
		req, err := decodeChatRequest([]byte(body))
		if err != nil || !slices.Equal(req.Needs, c.needs) {
			t.Errorf("%s: needs %v, %v; want %v", c.fields, req.Needs, err, c.needs)
		}
	}
	images := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"%s"}}]}]}`
	for url, needs := range map[string][]string{
		"data:image/png;base64,iVBORw0KGgo=": {"vision"},
		"https://example.com/cat.png":        {"vision", "remote_images"},
		"HTTP://example.com/cat.png":         {"vision", "remote_images"},
	} {
		req, err := decodeChatRequest([]byte(strings.Replace(images, "%s", url, 1)))
		if err != nil || !slices.Equal(req.Needs, needs) {
			t.Errorf("%s: needs %v, %v; want %v", url, req.Needs, err, needs)
		}
	}
	for fields, param := range map[string]string{
		tools + `,"tool_choice":"any"`:                                       "tool_choice",
		tools + `,"tool_choice":7`:                                           "tool_choice",
		tools + `,"tool_choice":{"function":{"name":"f"}}`:                   "tool_choice.type",
		tools + `,"tool_choice":{"type":"function","function":{"name":"h"}}`: "tool_choice.function.name",
		tools + `,"tool_choice":{"type":"function","function":{}}`:           "tool_choice.function.name",
		`"tool_choice":"required"`:                                           "tool_choice",
		tools + `,"parallel_tool_calls":"no"`:                                "parallel_tool_calls",
		`"reasoning_effort":3`:                                               "reasoning_effort",
		`"reasoning":"high"`:                                                 "reasoning",
		`"reasoning":{"effort":1}`:                                           "reasoning.effort",
	} {
		_, err := decodeChatRequest([]byte(`{"model":"m",` + user + `,` + fields + `}`))
		if re, ok := err.(*FieldError); !ok || re.Field != param {
			t.Errorf("%s: %v, want a 400 naming %s", fields, err, param)
		}
	}
}

// TestThinkingNeeds: an OpenAI request that asks the model to think needs
// a model that can (NeedThinking); one that does not ask, or asks for no
// thinking, needs nothing more: a think request never goes to a model
// whose server said it cannot think (where it would get Ollama's 400
// every time). Package ollama's test has the Ollama routes.
func TestThinkingNeeds(t *testing.T) {
	user := `"messages":[{"role":"user","content":"hi"}]`
	for fields, want := range map[string][]string{
		`"reasoning_effort":"high"`:     {"thinking"},
		`"reasoning_effort":"minimal"`:  {"thinking"},
		`"reasoning_effort":"none"`:     nil,
		`"reasoning":{"effort":"low"}`:  {"thinking"},
		`"reasoning":{"effort":"none"}`: nil,
		`"reasoning":{"enabled":true}`:  {"thinking"},
		`"reasoning":{"enabled":false}`: nil,
		`"temperature":0.2`:             nil,
	} {
		req, err := decodeChatRequest([]byte(`{"model":"m",` + user + `,` + fields + `}`))
		if err != nil || !slices.Equal(req.Needs, want) {
			t.Errorf("%s: needs %v, %v; want %v", fields, req.Needs, err, want)
		}
	}
}
