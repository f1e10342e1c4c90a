package translate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// This file serves a forced tool call (OpenAI's tool_choice "required" or
// {"type":"function",...}, allowed tools of mode "required"; Anthropic's
// "any" and "tool"; the Responses API's equivalents, all reaching here in
// the chat API's shape) on an Ollama provider, which has no tool_choice:
// the Ollama request carries no tools but a "format" (a JSON schema, which
// Ollama turns into a grammar the model's output must follow) that admits
// exactly the call, and the answer's text is read back as that call.
//
//	one tool may be called      format = its parameters schema (an object
//	                            schema: {"type":"object"} when it has
//	                            none); the text is the call's arguments
//	several tools may be called format = {"anyOf": [one object per tool:
//	                            {"name": {"const": N}, "arguments": its
//	                            parameters}, both required, name first]};
//	                            the text is {"name": N, "arguments": {...}}
//
// Since the model no longer sees the tools as tools, a system message
// appended to the conversation names them, with their descriptions and
// schemas, and says what to write.

// ForcedCall says that a chat request forced a tool call, which an Ollama
// provider's answer text holds (see ToOllamaChat): read it back with
// Call. The zero value is not used; a request without a forced call has a
// nil *ForcedCall.
type ForcedCall struct {
	// Names are the functions the call may name, in the request's order;
	// with one, the answer's text is the call's arguments; with several,
	// it is {"name": ..., "arguments": ...}.
	Names []string
}

// Call reads an answer's text as the forced call: the function's name and
// its arguments as JSON text. With one function, text is the arguments
// (trimmed; "{}" when empty, kept as sent when not JSON, as a model's
// broken arguments are). With several, text must be a JSON object whose
// "name" is one of Names and whose "arguments" is an object (absent: {});
// anything else is an error describing what came.
func (f *ForcedCall) Call(text string) (name, arguments string, err error) {
	text = strings.TrimSpace(text)
	if len(f.Names) == 1 {
		if text == "" {
			text = "{}"
		}
		return f.Names[0], text, nil
	}
	var call struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal([]byte(text), &call) != nil || !slices.Contains(f.Names, call.Name) {
		return "", "", fmt.Errorf("the model's forced tool call is not a JSON object naming one of the tools %q: %q", f.Names, clip(text))
	}
	args, _ := argumentsText(call.Arguments)
	return call.Name, args, nil
}

// forcedTool is one function tool of a forced call: its name, description
// and parameters schema.
type forcedTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// forceCall sets out up for a forced call of one of tools (OpenAI function
// tools, already kept to those the call may name): no tools, the format
// that admits only the call, and the system message that asks for it.
func forceCall(out *ollamaChatRequest, tools json.RawMessage) (*ForcedCall, error) {
	var defs []struct {
		Type     string     `json:"type"`
		Function forcedTool `json:"function"`
	}
	if err := json.Unmarshal(tools, &defs); err != nil || len(defs) == 0 {
		return nil, fieldErr("tool_choice", "forces a tool call, but the request has no function tools")
	}
	for _, d := range defs {
		if d.Type != "function" && d.Type != "" {
			return nil, fieldErr("tool_choice", "forces a tool call, but the tools include a tool of type %q, which this provider cannot be forced to call (only function tools can be); name a function, or leave that tool out", clip(d.Type))
		}
	}
	fs := make([]forcedTool, len(defs))
	forced := &ForcedCall{}
	for i, d := range defs {
		fs[i] = d.Function
		if isNull(fs[i].Parameters) || firstByte(fs[i].Parameters) != '{' {
			fs[i].Parameters = json.RawMessage(`{"type":"object"}`)
		}
		forced.Names = append(forced.Names, fs[i].Name)
	}
	listed, err := json.Marshal(fs)
	if err != nil {
		return nil, fieldErr("tools", "a tool's parameters are not a JSON schema")
	}
	var hint string
	if len(fs) == 1 {
		out.Format = fs[0].Parameters
		hint = fmt.Sprintf("Answer by calling the function %q, defined as %s. Reply with its arguments only: one JSON object that matches its parameters schema.", fs[0].Name, listed)
	} else {
		var b bytes.Buffer
		b.WriteString(`{"anyOf":[`)
		for i, f := range fs {
			if i > 0 {
				b.WriteByte(',')
			}
			name, _ := json.Marshal(f.Name)
			// "name" before "arguments": Ollama's grammar keeps the
			// schema's order, so the model picks the function first.
			fmt.Fprintf(&b, `{"type":"object","properties":{"name":{"const":%s},"arguments":%s},"required":["name","arguments"]}`, name, f.Parameters)
		}
		b.WriteString(`]}`)
		out.Format = b.Bytes()
		hint = fmt.Sprintf(`Answer by calling one of these functions: %s. Reply with the call only: one JSON object {"name": <the function's name>, "arguments": <an object that matches its parameters schema>}.`, listed)
	}
	out.Tools = nil
	out.Messages = append(out.Messages, ollamaMessage{Role: "system", Content: hint})
	return forced, nil
}
