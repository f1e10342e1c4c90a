package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// weatherTools defines one function tool with a string, an integer and a
// boolean parameter.
var weatherTools = json.RawMessage(`[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",` +
	`"properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"}}}}}]`)

func TestChooseToolRule(t *testing.T) {
	var tools []simTool
	if err := json.Unmarshal([]byte(`[{"type":"function","function":{"name":"a_tool"}},{"function":{"name":"b_tool"}},{"type":"retrieval","function":{"name":"c_tool"}}]`), &tools); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		last string
		want string
	}{
		{"please use b_tool then a_tool", "a_tool"}, // first in the order of tools
		{"call b_tool", "b_tool"},
		{"call c_tool", ""}, // not a function tool
		{"no tool named here", ""},
		{"", ""},
	} {
		got := chooseTool(tools, tt.last)
		name := ""
		if got != nil {
			name = got.Function.Name
		}
		if name != tt.want {
			t.Errorf("chooseTool(%q) = %q, want %q", tt.last, name, tt.want)
		}
	}
}

// TestToolChoicePick: an OpenAI request's tool_choice decides the call as
// an OpenAI-compatible server's does.
func TestToolChoicePick(t *testing.T) {
	var tools []simTool
	if err := json.Unmarshal([]byte(`[{"type":"function","function":{"name":"a_tool"}},{"type":"function","function":{"name":"b_tool"}}]`), &tools); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		choice, last, want string
		bad                bool
	}{
		{``, "use b_tool", "b_tool", false},
		{`"auto"`, "use b_tool", "b_tool", false},
		{`"none"`, "use b_tool", "", false},
		{`"required"`, "no tool named", "a_tool", false},
		{`"required"`, "use b_tool", "b_tool", false},
		{`{"type":"function","function":{"name":"b_tool"}}`, "use a_tool", "b_tool", false},
		{`{"type":"function","function":{"name":"z_tool"}}`, "", "", true},
		{`{"type":"allowed_tools","allowed_tools":{"mode":"auto"}}`, "use a_tool", "a_tool", false},
	} {
		var c toolChoice
		if tt.choice != "" {
			if err := json.Unmarshal([]byte(tt.choice), &c); err != nil {
				t.Fatalf("%s: %v", tt.choice, err)
			}
		}
		got, err := c.pick(tools, tt.last)
		name := ""
		if got != nil {
			name = got.Function.Name
		}
		if name != tt.want || (err != nil) != tt.bad {
			t.Errorf("tool_choice %s, %q: called %q, %v; want %q", tt.choice, tt.last, name, err, tt.want)
		}
	}
	var c toolChoice
	if err := json.Unmarshal([]byte(`"sometimes"`), &c); err == nil {
		t.Error("tool_choice sometimes accepted")
	}
}

func TestMakeToolCallArguments(t *testing.T) {
	var tools []simTool
	if err := json.Unmarshal(weatherTools, &tools); err != nil {
		t.Fatal(err)
	}
	call := makeToolCall(1, &tools[0], "get_weather please")
	var args struct {
		City   string `json:"city"`
		Days   int    `json:"days"`
		Metric bool   `json:"metric"`
	}
	if err := json.Unmarshal([]byte(call.arguments), &args); err != nil || args.City == "" || args.Days != 42 || !args.Metric {
		t.Fatalf("arguments %s (%v)", call.arguments, err)
	}
	if strings.Join(call.pieces, "") != call.arguments || len(call.pieces) < 2 {
		t.Fatalf("pieces %q do not split %s", call.pieces, call.arguments)
	}
	if again := makeToolCall(1, &tools[0], "get_weather please"); again.arguments != call.arguments {
		t.Fatalf("not deterministic: %s then %s", call.arguments, again.arguments)
	}
	if got := splitRunes("héllo wörld", 4); strings.Join(got, "|") != "héll|o wö|rld" {
		t.Fatalf("splitRunes = %q", got)
	}
}

func chatBody(model string, stream bool, extra string) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"stream":%v,%s"messages":[{"role":"user","content":"what is the weather? use get_weather"}]}`, model, stream, extra))
}

func TestOllamaToolCall(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOllama, Seed: 3})
	c := newClient(t)
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			resp := mustPost(t, c, url+"/api/chat", chatBody(DefaultModel, stream, `"tools":`+string(weatherTools)+`,`))
			lines, err := readNDJSON(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, %v", resp.StatusCode, err)
			}
			var calls []ollamaToolCall
			var last struct {
				Done       bool   `json:"done"`
				DoneReason string `json:"done_reason"`
				EvalCount  int    `json:"eval_count"`
			}
			for _, l := range lines {
				var obj struct {
					Message ollamaMessage `json:"message"`
				}
				if err := json.Unmarshal([]byte(l), &obj); err != nil {
					t.Fatal(err)
				}
				calls = append(calls, obj.Message.ToolCalls...)
				if err := json.Unmarshal([]byte(l), &last); err != nil {
					t.Fatal(err)
				}
			}
			if len(calls) != 1 || calls[0].Function.Name != "get_weather" || calls[0].Function.Arguments[0] != '{' {
				t.Fatalf("tool calls %+v in %q", calls, lines)
			}
			if !last.Done || last.DoneReason != "stop" || last.EvalCount < 2 {
				t.Fatalf("last line %+v", last)
			}
		})
	}
	t.Run("no tools, no call", func(t *testing.T) {
		resp := mustPost(t, c, url+"/api/chat", chatBody(DefaultModel, false, ""))
		lines, _ := readNDJSON(resp.Body)
		if len(lines) != 1 || strings.Contains(lines[0], "tool_calls") {
			t.Fatalf("answer %q", lines)
		}
	})
}

// openaiStreamChoices decodes a chat SSE stream into the chunks' choices.
func openaiStreamChoices(t *testing.T, resp *http.Response) (choices []openaiChoice, data []string) {
	t.Helper()
	data, err := readSSE(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range data {
		if d == "[DONE]" {
			continue
		}
		var chunk openaiCompletion
		if err := json.Unmarshal([]byte(d), &chunk); err != nil {
			t.Fatalf("chunk %s: %v", d, err)
		}
		choices = append(choices, chunk.Choices...)
	}
	return choices, data
}

func TestOpenAIToolCallStream(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOpenAI, Seed: 3})
	resp := mustPost(t, newClient(t), url+"/v1/chat/completions", chatBody(DefaultModel, true, `"tools":`+string(weatherTools)+`,`))
	choices, _ := openaiStreamChoices(t, resp)
	var args strings.Builder
	parts, finish := 0, ""
	for _, ch := range choices {
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
		if ch.Delta == nil {
			continue
		}
		for _, tc := range ch.Delta.ToolCalls {
			if tc.Index == nil || *tc.Index != 0 {
				t.Fatalf("tool call delta without index 0: %+v", tc)
			}
			if parts == 0 && (tc.ID == "" || tc.Type != "function" || tc.Function.Name != "get_weather" || tc.Function.Arguments != "") {
				t.Fatalf("first delta %+v: want id, type, name and empty arguments", tc)
			}
			if parts > 0 && (tc.ID != "" || tc.Function.Name != "") {
				t.Fatalf("later delta %+v repeats id or name", tc)
			}
			args.WriteString(tc.Function.Arguments)
			parts++
		}
	}
	if finish != "tool_calls" || parts < 3 || !json.Valid([]byte(args.String())) {
		t.Fatalf("finish %q, %d parts, arguments %q", finish, parts, args.String())
	}
}

func TestOpenAIChoicesInterleave(t *testing.T) {
	_, url, _ := startSim(t, Config{Protocol: ProtocolOpenAI, Seed: 3, DefaultMaxTokens: 3})
	c := newClient(t)
	resp := mustPost(t, c, url+"/v1/chat/completions", chatBody(DefaultModel, true, `"n":2,"stream_options":{"include_usage":true},`))
	choices, _ := openaiStreamChoices(t, resp)
	var order []int
	texts := make([]string, 2)
	for _, ch := range choices {
		if ch.Delta != nil && ch.Delta.Content != nil && *ch.Delta.Content != "" {
			order = append(order, ch.Index)
			texts[ch.Index] += *ch.Delta.Content
		}
	}
	if fmt.Sprint(order) != "[0 1 0 1 0 1]" {
		t.Fatalf("token order by choice %v, want interleaved", order)
	}
	if texts[0] == texts[1] {
		t.Fatalf("both choices say %q", texts[0])
	}

	resp = mustPost(t, c, url+"/v1/chat/completions", chatBody(DefaultModel, false, `"n":2,`))
	var got openaiCompletion
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Choices) != 2 || *got.Choices[0].Message.Content != texts[0] || *got.Choices[1].Message.Content != texts[1] ||
		got.Usage.CompletionTokens != 6 {
		t.Fatalf("non-streamed n=2 answer %+v, streamed texts %q", got, texts)
	}
	if resp := mustPost(t, c, url+"/v1/chat/completions", chatBody(DefaultModel, false, `"n":0,`)); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("n=0: status %d", resp.StatusCode)
	}
}

func TestFaultStreamErrorAfter(t *testing.T) {
	for _, p := range []Protocol{ProtocolOpenAI, ProtocolOllama} {
		t.Run(string(p), func(t *testing.T) {
			_, url, _ := startSim(t, Config{Protocol: p, Faults: Faults{StreamErrorAfter: 2}})
			path := "/api/chat"
			if p == ProtocolOpenAI {
				path = "/v1/chat/completions"
			}
			resp := mustPost(t, newClient(t), url+path, chatBody(DefaultModel, true, ""))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			var lines []string
			var err error
			if p == ProtocolOpenAI {
				lines, err = readSSE(resp.Body)
			} else {
				lines, err = readNDJSON(resp.Body)
			}
			if err != nil {
				t.Fatal(err)
			}
			errLine := lines[len(lines)-1]
			if p == ProtocolOpenAI {
				if errLine != "[DONE]" {
					t.Fatalf("stream does not end with [DONE]: %q", lines)
				}
				errLine = lines[len(lines)-2]
			}
			var e struct {
				Error json.RawMessage `json:"error"`
			}
			if json.Unmarshal([]byte(errLine), &e) != nil || len(e.Error) == 0 {
				t.Fatalf("no error event at the end: %q", lines)
			}
			tokens := strings.Count(strings.Join(lines, "\n"), `"content":" `)
			if tokens != 2 {
				t.Fatalf("%d tokens before the error, want 2: %q", tokens, lines)
			}
		})
	}
}
