package adapter

import (
	"encoding/json"
	"fmt"
	"strings"

	"iop/internal/translate"
	"iop/internal/wire/nodev1"
)

// cliPrompt renders req's body as the plain text a CLI command gets. For
// chat completions, one user message alone is its content, as is;
// otherwise every message becomes "<role>: <content>", in order, separated
// by a blank line:
//
//	system: Answer in French.
//
//	user: Hello
//
// A message's content is its string, or its text parts joined by newlines.
// For completions, it is the prompt (a string, or an array of exactly one).
//
// Every OpenAI sampling field (max_tokens, temperature, stop, ...) and
// response_format are ignored: a command takes no such settings. Errors are
// *Error of kind ErrBadRequest: embeddings, a non-empty tools list, a
// message with tool calls or an image part (a text program cannot take
// them), no messages, a body that does not parse.
func cliPrompt(req Request) (string, error) {
	switch req.Op {
	case nodev1.Operation_OPERATION_CHAT:
		return chatPrompt(req.Body)
	case nodev1.Operation_OPERATION_COMPLETION:
		prompt, err := translate.OpenAIPrompt(req.Body)
		if err != nil {
			return "", translateFailed(err)
		}
		return prompt, nil
	case nodev1.Operation_OPERATION_EMBEDDINGS:
		return "", badRequest("embeddings are not supported by a cli provider")
	default:
		return "", badRequest("operation %v is not supported", req.Op)
	}
}

// chatPrompt renders a chat completions body; see cliPrompt.
func chatPrompt(body []byte) (string, error) {
	var in struct {
		Messages []struct {
			Role      string            `json:"role"`
			Content   json.RawMessage   `json:"content"` // string | []part | null
			ToolCalls []json.RawMessage `json:"tool_calls"`
		} `json:"messages"`
		Tools json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return "", badRequest("request body is not a valid chat completions object")
	}
	if len(in.Messages) == 0 {
		return "", fieldBadRequest("messages", "at least one message is required")
	}
	var tools []json.RawMessage
	if !isNull(in.Tools) && (json.Unmarshal(in.Tools, &tools) != nil || len(tools) > 0) {
		return "", fieldBadRequest("tools", "tools are not supported by a cli provider")
	}
	var b strings.Builder
	for i, m := range in.Messages {
		if m.Role == "" {
			return "", fieldBadRequest(fmt.Sprintf("messages[%d].role", i), "role is required")
		}
		if len(m.ToolCalls) > 0 {
			return "", fieldBadRequest(fmt.Sprintf("messages[%d].tool_calls", i), "tool calls are not supported by a cli provider")
		}
		text, err := textContent(m.Content, i)
		if err != nil {
			return "", err
		}
		if len(in.Messages) == 1 && m.Role == "user" {
			return text, nil
		}
		if i > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(m.Role)
		b.WriteString(": ")
		b.WriteString(text)
	}
	return b.String(), nil
}

// textContent flattens message content that holds text only: a string, or
// text parts joined by newlines; null is empty.
func textContent(raw json.RawMessage, i int) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", fieldBadRequest(fmt.Sprintf("messages[%d].content", i), "want a string or an array of parts")
	}
	texts := make([]string, 0, len(parts))
	for j, p := range parts {
		if p.Type != "text" {
			return "", fieldBadRequest(fmt.Sprintf("messages[%d].content[%d].type", i, j), "part type %q is not supported by a cli provider (text only)", p.Type)
		}
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "\n"), nil
}
