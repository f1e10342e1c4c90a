package sim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// simTool is one function tool a chat request defines, in the shape both
// protocols use: {"type":"function","function":{"name","parameters"}}.
type simTool struct {
	Type     string `json:"type"`
	Function struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// argumentPieceRunes is the size, in characters, of the pieces a streamed
// OpenAI tool call's arguments are split into (one piece per chunk).
const argumentPieceRunes = 4

// toolCall is the simulator's answer to a request that triggers a tool
// call (see chooseTool). OpenAI answers carry it in message.tool_calls
// with finish_reason "tool_calls"; streamed, the first delta has index,
// id, type and name, and later deltas add the argument pieces. Ollama
// answers carry the whole call in one message.tool_calls (arguments an
// object, no id) with done_reason "stop".
type toolCall struct {
	name      string
	arguments string   // JSON object text
	pieces    []string // arguments cut into argumentPieceRunes-character pieces
}

// chooseTool is the simulator's documented tool-call rule: a chat request
// is answered with a tool call when it defines at least one function tool
// and its last message is a user message whose text contains the name of
// one of them. The first such tool, in the order of "tools", is called.
// It returns nil when the rule does not fire.
func chooseTool(tools []simTool, lastUser string) *simTool {
	if lastUser == "" {
		return nil
	}
	for i, t := range tools {
		if (t.Type == "" || t.Type == "function") && t.Function.Name != "" && strings.Contains(lastUser, t.Function.Name) {
			return &tools[i]
		}
	}
	return nil
}

// toolChoice is an OpenAI request's "tool_choice" as the simulator honours
// it, as an OpenAI-compatible server does (OpenAI API reference, "Create
// chat completion"): "" or "auto" (chooseTool's rule), "none" (no call),
// "required" (a call: chooseTool's, else the first tool), or the name of
// the function to call (a {"type":"function","function":{"name"}} object).
type toolChoice string

// UnmarshalJSON reads the string or the function object; another object
// type (allowed_tools, custom) is taken as "auto".
func (c *toolChoice) UnmarshalJSON(b []byte) error {
	var mode string
	if json.Unmarshal(b, &mode) == nil {
		switch mode {
		case "none", "auto", "required":
			*c = toolChoice(mode)
			return nil
		}
		return fmt.Errorf(`tool_choice: want "none", "auto", "required" or a function, got %q`, mode)
	}
	var fn struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(b, &fn); err != nil {
		return fmt.Errorf("tool_choice: %w", err)
	}
	*c = "auto"
	if fn.Type == "function" {
		if fn.Function.Name == "" {
			return fmt.Errorf("tool_choice: a function tool_choice must name the function")
		}
		*c = toolChoice("function:" + fn.Function.Name)
	}
	return nil
}

// pick is the tool the answer calls under the choice, or nil; a named
// function that is not among tools is an error.
func (c toolChoice) pick(tools []simTool, lastUser string) (*simTool, error) {
	switch {
	case c == "none":
		return nil, nil
	case c == "required":
		if t := chooseTool(tools, lastUser); t != nil {
			return t, nil
		}
		for i, t := range tools {
			if (t.Type == "" || t.Type == "function") && t.Function.Name != "" {
				return &tools[i], nil
			}
		}
		return nil, fmt.Errorf(`%w: tool_choice "required" needs tools`, errInvalidRequest)
	case strings.HasPrefix(string(c), "function:"):
		name := strings.TrimPrefix(string(c), "function:")
		for i, t := range tools {
			if t.Function.Name == name {
				return &tools[i], nil
			}
		}
		return nil, fmt.Errorf("%w: tool_choice names %q, which is not among the tools", errInvalidRequest, name)
	}
	return chooseTool(tools, lastUser), nil
}

// makeToolCall builds the call of tool for a prompt: its arguments hold
// one member per property of the tool's "parameters" JSON schema, in name
// order, valued by the property's type: 42 for "integer" and "number",
// true for "boolean", otherwise a word drawn from the vocabulary by a PRNG
// seeded with (seed, prompt). Usage counts one completion token per piece.
func makeToolCall(seed int64, tool *simTool, prompt string) toolCall {
	var params struct {
		Properties map[string]struct {
			Type json.RawMessage `json:"type"` // a string, or an array of them
		} `json:"properties"`
	}
	_ = json.Unmarshal(tool.Function.Parameters, &params) // no usable schema: no arguments
	rng := rngFor(seed, prompt)
	names := make([]string, 0, len(params.Properties))
	for name := range params.Properties {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteByte('{')
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		key, _ := json.Marshal(name)
		b.Write(key)
		b.WriteByte(':')
		switch typ := strings.Trim(string(params.Properties[name].Type), `"`); typ {
		case "integer", "number":
			b.WriteString("42")
		case "boolean":
			b.WriteString("true")
		default:
			fmt.Fprintf(&b, "%q", vocabulary[rng.IntN(len(vocabulary))])
		}
	}
	b.WriteByte('}')
	args := b.String()
	return toolCall{name: tool.Function.Name, arguments: args, pieces: splitRunes(args, argumentPieceRunes)}
}

// splitRunes cuts s into pieces of n characters (the last may be shorter),
// never inside a UTF-8 sequence.
func splitRunes(s string, n int) []string {
	var pieces []string
	for len(s) > 0 {
		end, count := 0, 0
		for end < len(s) && count < n {
			_, size := utf8.DecodeRuneInString(s[end:])
			end += size
			count++
		}
		pieces = append(pieces, s[:end])
		s = s[end:]
	}
	return pieces
}

// toolCallID is the id of the tool call of choice i of admitted request
// seq: "call_sim_<seq>_<i>".
func toolCallID(seq uint64, i int) string { return fmt.Sprintf("call_sim_%d_%d", seq, i) }
