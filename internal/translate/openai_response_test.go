package translate

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// stream runs an OpenAIStream over writes and returns its text and answer
// (with the reasoning deltas, joined, as the answer's Thinking).
func stream(writes ...string) (string, Answer, error) {
	var s OpenAIStream
	var text, thinking strings.Builder
	onDelta := func(d Delta) error { text.WriteString(d.Text); thinking.WriteString(d.Thinking); return nil }
	for _, w := range writes {
		if err := s.Feed([]byte(w), onDelta); err != nil {
			return text.String(), Answer{}, err
		}
	}
	a, err := s.End()
	a.Thinking = thinking.String()
	return text.String(), a, err
}

func TestOpenAIStream(t *testing.T) {
	t.Run("text, finish and a usage chunk with empty choices", func(t *testing.T) {
		text, a, err := stream(
			`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n",
			`data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}`+"\n\n"+`data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"length"}]}`+"\n\n",
			`data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`+"\n\n",
			"data: [DONE]\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"after done\"}}]}\n\n")
		if err != nil || text != "Hi there" || a.Finish != "length" || *a.Usage != (Usage{PromptTokens: 4, CompletionTokens: 2}) {
			t.Fatalf("%q %+v %v", text, a, err)
		}
	})
	t.Run("text completion chunks", func(t *testing.T) {
		text, a, err := stream(`data: {"object":"text_completion","choices":[{"index":0,"text":"ab","finish_reason":null}]}`+"\n\n",
			`data: {"choices":[{"index":0,"text":"c","finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		if err != nil || text != "abc" || a.Finish != "stop" || a.Usage != nil {
			t.Fatalf("%q %+v %v", text, a, err)
		}
	})
	t.Run("other choices are ignored", func(t *testing.T) {
		text, _, err := stream(`data: {"choices":[{"index":1,"delta":{"content":"x"}},{"index":0,"delta":{"content":"y"},"finish_reason":"stop"}]}` + "\n\n")
		if err != nil || text != "y" {
			t.Fatalf("%q %v", text, err)
		}
	})
	t.Run("tool call deltas", func(t *testing.T) {
		_, a, err := stream(
			`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"f","arguments":"{\"a\""}},{"index":1,"id":"c2","function":{"name":"g","arguments":""}}]}}]}`+"\n\n",
			`data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{}"}},{"index":0,"function":{"arguments":":1}"}}]}}]}`+"\n\n",
			`data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`+"\n\n")
		want := []ToolCall{{ID: "c1", Name: "f", Arguments: `{"a":1}`}, {ID: "c2", Name: "g", Arguments: "{}"}}
		if err != nil || !reflect.DeepEqual(a.ToolCalls, want) || a.Finish != "tool_calls" {
			t.Fatalf("%+v %v", a, err)
		}
	})
	t.Run("an error object in the stream", func(t *testing.T) {
		text, _, err := stream(`data: {"choices":[{"index":0,"delta":{"content":"x"}}]}`+"\n\n", `data: {"error":{"message":"overloaded","type":"server_error"}}`+"\n\n")
		var pe *ProviderError
		if !errors.As(err, &pe) || pe.Message != "overloaded" || pe.Code != "server_error" || text != "x" {
			t.Fatalf("%q %v", text, err)
		}
		_, _, err = stream(`data: {"error":"plain text"}` + "\n\n")
		if !errors.As(err, &pe) || pe.Message != "plain text" {
			t.Fatalf("%v", err)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		if _, _, err := stream(`data: {"choices":[{"index":0,"delta":{"content":"x"}}]}` + "\n\n"); !errors.Is(err, ErrStreamTruncated) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("not JSON", func(t *testing.T) {
		if _, _, err := stream("data: {oops\n\n"); !errors.Is(err, ErrMalformedAnswer) {
			t.Fatalf("%v", err)
		}
	})
}

func TestDecodeOpenAIAnswer(t *testing.T) {
	a, err := DecodeOpenAIAnswer([]byte(`{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":null,
		"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	if err != nil || a.Text != "" || len(a.ToolCalls) != 1 || a.ToolCalls[0].Name != "f" || a.Finish != "tool_calls" || *a.Usage != (Usage{PromptTokens: 3, CompletionTokens: 1}) {
		t.Fatalf("%+v %v", a, err)
	}
	a, err = DecodeOpenAIAnswer([]byte(`{"object":"text_completion","choices":[{"index":0,"text":"hello","finish_reason":"stop"}]}`))
	if err != nil || a.Text != "hello" || a.Finish != "stop" {
		t.Fatalf("%+v %v", a, err)
	}
	var pe *ProviderError
	if _, err := DecodeOpenAIAnswer([]byte(`{"error":{"message":"bad"}}`)); !errors.As(err, &pe) || pe.Message != "bad" {
		t.Fatalf("%v", err)
	}
	if _, err := DecodeOpenAIAnswer([]byte(`{"choices":[]}`)); !errors.Is(err, ErrMalformedAnswer) {
		t.Fatalf("%v", err)
	}
	for body, want := range map[string]string{
		`{"error":{"message":"m","type":"t"}}`: "m",
		`{"error":"e"}`:                        "e",
		`{"object":"error","message":"vllm"}`:  "vllm",
		`<html>`:                               "",
	} {
		if got := DecodeOpenAIError([]byte(body)); got != want {
			t.Fatalf("DecodeOpenAIError(%s) = %q, want %q", body, got, want)
		}
	}
}

func TestOllamaToolCallsAndDoneReason(t *testing.T) {
	calls := OllamaToolCalls([]ToolCall{{Name: "f", Arguments: `{"a":1}`}, {Name: "g"}, {Name: "h", Arguments: `{"broken`}})
	got := []string{string(calls[0].Function.Arguments), string(calls[1].Function.Arguments), string(calls[2].Function.Arguments)}
	if want := []string{`{"a":1}`, `{}`, `"{\"broken"`}; !reflect.DeepEqual(got, want) {
		t.Fatalf("arguments %q, want %q", got, want)
	}
	for finish, want := range map[string]string{"length": "length", "stop": "stop", "tool_calls": "stop", "": "stop"} {
		if got := OllamaDoneReason(finish); got != want {
			t.Fatalf("OllamaDoneReason(%q) = %q", finish, got)
		}
	}
}

func TestOpenAIStreamReasoning(t *testing.T) {
	for _, c := range []struct {
		name, stream   string
		text, thinking string
	}{
		{"reasoning_content (vLLM, DeepSeek)",
			`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":"Let me"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"reasoning_content":" think."}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}` + "\n\n",
			"Hi", "Let me think."},
		{"reasoning (Ollama's /v1, OpenRouter)",
			`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"Hmm"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}` + "\n\n",
			"Hi", "Hmm"},
		{"both names with the same text count once",
			`data: {"choices":[{"index":0,"delta":{"reasoning_content":"once","reasoning":"once"}}]}` + "\n\n" +
				`data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}` + "\n\n",
			"x", "once"},
		{"a reasoning object (not text) is ignored",
			`data: {"choices":[{"index":0,"delta":{"reasoning":{"summary":"s"},"content":"x"},"finish_reason":"stop"}]}` + "\n\n",
			"x", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			text, a, err := stream(c.stream)
			if err != nil || text != c.text || a.Thinking != c.thinking {
				t.Fatalf("text %q thinking %q %v; want %q %q", text, a.Thinking, err, c.text, c.thinking)
			}
		})
	}
	t.Run("a thinking-only stream so far hands each delta over at once", func(t *testing.T) {
		var s OpenAIStream
		var got []Delta
		err := s.Feed([]byte(`data: {"choices":[{"index":0,"delta":{"reasoning_content":"a"}}]}`+"\n\n"), func(d Delta) error { got = append(got, d); return nil })
		if err != nil || !reflect.DeepEqual(got, []Delta{{Thinking: "a"}}) {
			t.Fatalf("%+v %v", got, err)
		}
	})
	t.Run("a whole answer", func(t *testing.T) {
		for _, body := range []string{
			`{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi","reasoning_content":"Because."},"finish_reason":"stop"}]}`,
			`{"choices":[{"index":0,"message":{"role":"assistant","content":"Hi","reasoning":"Because."},"finish_reason":"stop"}]}`,
		} {
			a, err := DecodeOpenAIAnswer([]byte(body))
			if err != nil || a.Text != "Hi" || a.Thinking != "Because." {
				t.Fatalf("%s: %+v %v", body, a, err)
			}
		}
	})
}

// TestRegression_OpenAIStreamLastEventWithoutBlankLine: an event the
// stream did not end with a blank line is discarded (WHATWG HTML, "if the
// file ends in the middle of an event, before the final empty line, the
// incomplete event is not dispatched"), so a stream cut after its last
// data line is truncated, not complete.
func TestRegression_OpenAIStreamLastEventWithoutBlankLine(t *testing.T) {
	text, _, err := stream(`data: {"choices":[{"index":0,"delta":{"content":"a"}}]}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}` + "\n")
	if !errors.Is(err, ErrStreamTruncated) || text != "a" {
		t.Fatalf("%q %v", text, err)
	}
}
