package translate

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// stream runs an OpenAIStream over writes and returns its text and answer.
func stream(writes ...string) (string, Answer, error) {
	var s OpenAIStream
	var text strings.Builder
	onText := func(t string) error { text.WriteString(t); return nil }
	for _, w := range writes {
		if err := s.Feed([]byte(w), onText); err != nil {
			return text.String(), Answer{}, err
		}
	}
	a, err := s.End(onText)
	return text.String(), a, err
}

func TestOpenAIStream(t *testing.T) {
	t.Run("text, finish and a usage chunk with empty choices", func(t *testing.T) {
		text, a, err := stream(
			`data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n",
			`data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}`+"\n\n"+`data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"length"}]}`+"\n\n",
			`data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6}}`+"\n\n",
			"data: [DONE]\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"after done\"}}]}\n\n")
		if err != nil || text != "Hi there" || a.Finish != "length" || *a.Usage != (Usage{4, 2}) {
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
	if err != nil || a.Text != "" || len(a.ToolCalls) != 1 || a.ToolCalls[0].Name != "f" || a.Finish != "tool_calls" || *a.Usage != (Usage{3, 1}) {
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
