package translate

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// This file translates a request of Anthropic's Messages API (POST
// /v1/messages and /v1/messages/count_tokens; Anthropic API reference,
// docs.anthropic.com/en/api/messages) into the canonical OpenAI chat
// completions body the edge dispatches. anthropic_response.go renders the
// answer back.

// AnthropicRequest is a Messages API request translated to a canonical
// OpenAI chat completions request.
type AnthropicRequest struct {
	// Model is the model the client asked for.
	Model string
	// Body is the canonical OpenAI chat body: it always streams ("stream":
	// true, "stream_options": {"include_usage": true}); the edge renders
	// the stream as one message when the client did not ask for one.
	Body []byte
	// Stream is the client's "stream" (default false, as Anthropic).
	Stream bool
	// MaxTokens is "max_tokens" (0 for count_tokens, where it is not
	// required).
	MaxTokens int
	// OllamaFields is the JSON form of the OllamaFields the request carries
	// apart from Body, for Ollama providers: "think" (from "thinking") and
	// "options.top_k" (from "top_k"), which OpenAI has no name for.
	OllamaFields json.RawMessage
	// Extension lists the fields of OllamaFields ("options.top_k",
	// "think"), sorted.
	Extension []string
	// Thinking is set for "thinking" {"type": "enabled"}: the request
	// needs a model that thinks, and the answer carries thinking blocks.
	// Without it (thinking absent or "disabled", Anthropic's default) the
	// provider is asked not to think and any reasoning it sends anyway is
	// dropped from the answer.
	Thinking bool
	// Tools is set when the request defines tools.
	Tools bool
	// ToolChoiceAny is set for tool_choice {"type": "any"}: the answer must
	// call a tool (OpenAI's tool_choice "required", which every provider
	// serves: an Ollama one through a format, see ToOllamaChatRequest).
	ToolChoiceAny bool
	// OneToolCall is tool_choice.disable_parallel_tool_use: the answer
	// keeps the model's first tool call only (the edge enforces it, so
	// every provider can serve it).
	OneToolCall bool
	// Vision is set when a message carries an image; RemoteImages when one
	// is given by an http(s) URL (only a provider that fetches it itself
	// can take it).
	Vision, RemoteImages bool
	// StopSequences are the request's "stop_sequences".
	StopSequences []string
	// EstimatedInputTokens is the characters (Unicode code points) of the
	// prompt / 4, rounded up, counted as the edge counts a chat request:
	// the system text, every text block, tool_use names and inputs (as
	// JSON), tool_result text, and the JSON of each tool definition as the
	// canonical body carries it.
	EstimatedInputTokens int
}

// anthropicServerTools are the prefixes of the "type" of Anthropic's
// server and Anthropic-defined tools (web_search_20250305, bash_20250124,
// text_editor_20250728, computer_20250124, code_execution_..., web_fetch_...,
// memory_...): tools Anthropic runs or defines, which no iop provider
// has.
var anthropicServerTools = []string{"web_search", "web_fetch", "bash", "text_editor", "computer", "code_execution", "memory", "tool_search", "mcp"}

// anthropicCanonical is the canonical chat body of a Messages request,
// members in this order.
type anthropicCanonical struct {
	Model         string          `json:"model"`
	Messages      []any           `json:"messages"`
	Stream        bool            `json:"stream"`
	StreamOptions map[string]bool `json:"stream_options"`
	MaxTokens     int             `json:"max_tokens,omitempty"`
	Temperature   *float64        `json:"temperature,omitempty"`
	TopP          *float64        `json:"top_p,omitempty"`
	Stop          []string        `json:"stop,omitempty"`
	Tools         []any           `json:"tools,omitempty"`
	ToolChoice    any             `json:"tool_choice,omitempty"`
	User          string          `json:"user,omitempty"`
}

// maxAnthropicTokens bounds max_tokens (and so budget_tokens, below it):
// the largest max_tokens iop passes on (a canonical body's max_tokens,
// Ollama's num_predict, are 32-bit integers); a larger one is refused,
// not cut.
const maxAnthropicTokens = math.MaxInt32

// anthropicImageTypes are the media types a base64 image source may have
// (Anthropic API reference, "Messages": Base64ImageSource.media_type).
var anthropicImageTypes = []string{"image/jpeg", "image/png", "image/gif", "image/webp"}

// minThinkingBudget is the least budget_tokens Anthropic accepts.
const minThinkingBudget = 1024

// FromAnthropicMessages translates a POST /v1/messages body (Anthropic API
// reference, "Messages"):
//
//	system (a string or text blocks)   a system message, the blocks' text
//	                                   joined by blank lines
//	messages[] role user / assistant   messages of that role
//	  content: a string                content
//	  text blocks                      text (parts when there are images)
//	  image, source base64             an image_url part, a data: URL
//	   {media_type, data}              of that media type
//	  image, source url (http, https)  an image_url part with the URL
//	                                   (RemoteImages)
//	  tool_use {id, name, input}       tool_calls {id, function {name,
//	                                   arguments: input as JSON text}}
//	  tool_result {tool_use_id,        a tool message {tool_call_id,
//	   content, is_error}              content: its text, "Error: " first
//	                                   when is_error}, before the user's
//	                                   other blocks
//	  thinking, redacted_thinking      accepted and dropped (an earlier
//	                                   answer's reasoning, which providers
//	                                   do not take back)
//	tools [{name, description,         tools [{type function, function
//	  input_schema}]                   {name, description, parameters}}]
//	tool_choice auto / none            "auto" / "none"
//	            tool {name}            {type function, function {name}}
//	            any                    "required" (ToolChoiceAny)
//	  disable_parallel_tool_use        OneToolCall (the edge keeps the
//	                                   first call)
//	max_tokens                         max_tokens
//	stop_sequences                     stop
//	temperature, top_p                 the same
//	top_k                              options.top_k in OllamaFields
//	thinking {type enabled,            Thinking; think true in
//	  budget_tokens}                   OllamaFields; disabled or absent:
//	                                   think false
//	metadata.user_id                   user
//
// cache_control on blocks and tools, and unknown top-level fields, are
// ignored. Errors are *FieldError naming the field: a body that is not a
// JSON object, a missing model, max_tokens missing or not an integer from
// 1 to 2147483647 (maxAnthropicTokens), no messages, a role other than
// user or assistant, a message with empty content (an empty string or no
// blocks) but for a last assistant message (Anthropic's rule), an unknown
// content block type (document, search_result, server tool blocks, ...)
// or one in the wrong role's message, an image source that is neither
// base64 nor url, a base64 source whose media_type is not image/jpeg,
// image/png, image/gif or image/webp or whose data is not standard,
// padded base64, a url source that is not an http(s) URL, a tool_result
// with an image, a server tool (refused by its type), a tool without a
// name or input_schema, a tool_choice of another type or naming no
// defined tool, more than 4 stop sequences (the canonical body's limit),
// temperature or top_p not a number from 0 to 1, thinking of another
// type or budget_tokens below 1024 or not below max_tokens, a metadata
// that is not an object.
func FromAnthropicMessages(body []byte) (AnthropicRequest, error) {
	return fromAnthropic(body, true)
}

// FromAnthropicCountTokens translates a POST /v1/messages/count_tokens
// body: a Messages request without max_tokens (checked when given),
// translated and checked as FromAnthropicMessages does.
func FromAnthropicCountTokens(body []byte) (AnthropicRequest, error) {
	return fromAnthropic(body, false)
}

func fromAnthropic(body []byte, create bool) (AnthropicRequest, error) {
	top, err := decodeTop(body)
	if err != nil {
		return AnthropicRequest{}, err
	}
	var req AnthropicRequest
	if err := decodeField(top, "model", &req.Model); err != nil {
		return AnthropicRequest{}, err
	}
	if strings.TrimSpace(req.Model) == "" {
		return AnthropicRequest{}, fieldErr("model", "Field required")
	}
	if raw, ok := top["max_tokens"]; ok && !isNull(raw) {
		n, err := integer(raw, "max_tokens")
		if err != nil || n < 1 || n > maxAnthropicTokens {
			return AnthropicRequest{}, fieldErr("max_tokens", "must be an integer from 1 to %d", maxAnthropicTokens)
		}
		req.MaxTokens = int(n)
	} else if create {
		return AnthropicRequest{}, fieldErr("max_tokens", "Field required")
	}
	if err := decodeField(top, "stream", &req.Stream); err != nil {
		return AnthropicRequest{}, err
	}
	out := &anthropicCanonical{Model: req.Model, Stream: true, StreamOptions: map[string]bool{"include_usage": true},
		MaxTokens: req.MaxTokens}
	t := &anthropicTranslation{req: &req, out: out}
	if err := t.system(top["system"]); err != nil {
		return AnthropicRequest{}, err
	}
	if err := t.messages(top["messages"]); err != nil {
		return AnthropicRequest{}, err
	}
	if err := t.tools(top["tools"], top["tool_choice"]); err != nil {
		return AnthropicRequest{}, err
	}
	if err := t.sampling(top); err != nil {
		return AnthropicRequest{}, err
	}
	if err := t.thinking(top["thinking"]); err != nil {
		return AnthropicRequest{}, err
	}
	var meta struct {
		UserID *string `json:"user_id"`
	}
	if raw := top["metadata"]; !isNull(raw) {
		if firstByte(raw) != '{' || json.Unmarshal(raw, &meta) != nil {
			return AnthropicRequest{}, fieldErr("metadata", "expected an object with a string user_id")
		}
		if meta.UserID != nil {
			out.User = *meta.UserID
		}
	}
	req.EstimatedInputTokens = (t.chars + 3) / 4
	if len(t.ext) > 0 {
		if req.OllamaFields, err = json.Marshal(t.ext); err != nil {
			return AnthropicRequest{}, err
		}
	}
	if req.Body, err = json.Marshal(out); err != nil {
		return AnthropicRequest{}, err
	}
	return req, nil
}

// anthropicTranslation is the state of one request's translation.
type anthropicTranslation struct {
	req   *AnthropicRequest
	out   *anthropicCanonical
	chars int            // the prompt's characters, for the estimate
	ext   map[string]any // OllamaFields
}

func (t *anthropicTranslation) count(s string) { t.chars += utf8.RuneCountInString(s) }

// setExt sets the OllamaFields member at path ("think", or "options.top_k"
// inside "options") to v, and lists path in Extension.
func (t *anthropicTranslation) setExt(path string, v any) {
	if t.ext == nil {
		t.ext = make(map[string]any)
	}
	if k, sub, ok := strings.Cut(path, "."); ok {
		m, _ := t.ext[k].(map[string]any)
		if m == nil {
			m = make(map[string]any)
			t.ext[k] = m
		}
		m[sub] = v
	} else {
		t.ext[path] = v
	}
	t.req.Extension = append(t.req.Extension, path)
	sort.Strings(t.req.Extension)
}

// anthropicBlock is one content block as a request carries it (Anthropic
// API reference, "Messages", content block params).
type anthropicBlock struct {
	Type   string          `json:"type"`
	Text   *string         `json:"text"`
	Source json.RawMessage `json:"source"` // image
	// tool_use
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
	// tool_result
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

// system translates "system": a string or an array of text blocks.
func (t *anthropicTranslation) system(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	text, err := t.textOf(raw, "system")
	if err != nil {
		return err
	}
	if text != "" {
		t.out.Messages = append(t.out.Messages, map[string]any{"role": "system", "content": text})
	}
	return nil
}

// textOf reads a string or an array of text blocks (their text joined by
// blank lines) and counts it.
func (t *anthropicTranslation) textOf(raw json.RawMessage, field string) (string, error) {
	return t.joinText(raw, field, "\n\n", "expected a text block with a string text")
}

// joinText reads raw, a string or an array of text blocks, as one text
// (the blocks' texts joined by sep) and counts it; a block of another
// type is refused with notText and its type.
func (t *anthropicTranslation) joinText(raw json.RawMessage, field, sep, notText string) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		t.count(s)
		return s, nil
	}
	var blocks []anthropicBlock
	if firstByte(raw) != '[' || json.Unmarshal(raw, &blocks) != nil {
		return "", fieldErr(field, "expected a string or an array of text blocks")
	}
	texts := make([]string, 0, len(blocks))
	for i, b := range blocks {
		if b.Type != "text" || b.Text == nil {
			return "", fieldErr(fmt.Sprintf("%s[%d]", field, i), "%s, got type %s", notText, strconv.Quote(clip(b.Type)))
		}
		t.count(*b.Text)
		texts = append(texts, *b.Text)
	}
	return strings.Join(texts, sep), nil
}

// messages translates "messages".
func (t *anthropicTranslation) messages(raw json.RawMessage) error {
	if isNull(raw) {
		return fieldErr("messages", "Field required")
	}
	var msgs []json.RawMessage
	if firstByte(raw) != '[' || json.Unmarshal(raw, &msgs) != nil {
		return fieldErr("messages", "expected an array of messages")
	}
	if len(msgs) == 0 {
		return fieldErr("messages", "at least one message is required")
	}
	// Anthropic's own words for an empty content, which its clients show.
	const emptyContent = "all messages must have non-empty content except for the optional final assistant message"
	for i, rm := range msgs {
		field := fmt.Sprintf("messages[%d]", i)
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if firstByte(rm) != '{' || json.Unmarshal(rm, &m) != nil {
			return fieldErr(field, "expected an object with a string role and content")
		}
		switch m.Role {
		case "user", "assistant":
		default:
			return fieldErr(field+".role", `must be "user" or "assistant", got %s`, strconv.Quote(clip(m.Role)))
		}
		if isNull(m.Content) {
			return fieldErr(field+".content", "Field required")
		}
		finalAssistant := m.Role == "assistant" && i == len(msgs)-1
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			if s == "" && !finalAssistant {
				return fieldErr(field+".content", emptyContent)
			}
			t.count(s)
			t.out.Messages = append(t.out.Messages, map[string]any{"role": m.Role, "content": s})
			continue
		}
		var blocks []json.RawMessage
		if firstByte(m.Content) != '[' || json.Unmarshal(m.Content, &blocks) != nil {
			return fieldErr(field+".content", "expected a string or an array of content blocks")
		}
		if len(blocks) == 0 && !finalAssistant {
			return fieldErr(field+".content", emptyContent)
		}
		var err error
		if m.Role == "user" {
			err = t.userBlocks(blocks, field+".content")
		} else {
			err = t.assistantBlocks(blocks, field+".content")
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// decodeBlock decodes one content block.
func decodeBlock(raw json.RawMessage, field string) (anthropicBlock, error) {
	var b anthropicBlock
	if firstByte(raw) != '{' {
		return b, fieldErr(field, "expected a content block object")
	}
	if err := json.Unmarshal(raw, &b); err != nil {
		return b, typeError(err, field)
	}
	return b, nil
}

// userBlocks translates a user message's blocks: its tool results become
// tool messages, first (Anthropic puts them first; OpenAI wants them
// right after the assistant's calls), then one user message with the
// rest.
func (t *anthropicTranslation) userBlocks(blocks []json.RawMessage, field string) error {
	var parts []map[string]any
	text := true // every part is text
	for j, raw := range blocks {
		bf := fmt.Sprintf("%s[%d]", field, j)
		b, err := decodeBlock(raw, bf)
		if err != nil {
			return err
		}
		switch b.Type {
		case "text":
			if b.Text == nil {
				return fieldErr(bf+".text", "Field required")
			}
			t.count(*b.Text)
			parts = append(parts, map[string]any{"type": "text", "text": *b.Text})
		case "image":
			url, err := t.imageURL(b.Source, bf+".source")
			if err != nil {
				return err
			}
			text = false
			parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": url}})
		case "tool_result":
			if b.ToolUseID == "" {
				return fieldErr(bf+".tool_use_id", "Field required")
			}
			content, err := t.toolResultText(b.Content, bf+".content")
			if err != nil {
				return err
			}
			if b.IsError {
				content = "Error: " + content
			}
			t.out.Messages = append(t.out.Messages, map[string]any{"role": "tool", "tool_call_id": b.ToolUseID, "content": content})
		default:
			return fieldErr(bf+".type", "a user message's content block must be text, image or tool_result, got %s", strconv.Quote(clip(b.Type)))
		}
	}
	switch {
	case len(parts) == 0:
		return nil
	case text:
		texts := make([]string, len(parts))
		for i, p := range parts {
			texts[i] = p["text"].(string)
		}
		t.out.Messages = append(t.out.Messages, map[string]any{"role": "user", "content": strings.Join(texts, "\n")})
	default:
		t.out.Messages = append(t.out.Messages, map[string]any{"role": "user", "content": parts})
	}
	return nil
}

// imageURL is the URL of an image block's source: a data: URL of its
// media_type for base64 data, the URL itself for an http(s) url source
// (RemoteImages). Anthropic takes nothing else; a file: or any other URL
// is refused, as it would reach whatever the provider can read.
func (t *anthropicTranslation) imageURL(raw json.RawMessage, field string) (string, error) {
	var src struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		URL       string `json:"url"`
	}
	if firstByte(raw) != '{' || json.Unmarshal(raw, &src) != nil {
		return "", fieldErr(field, "expected an image source object")
	}
	t.req.Vision = true
	switch src.Type {
	case "base64":
		data := strings.TrimSpace(src.Data)
		if data == "" {
			return "", fieldErr(field+".data", "Field required")
		}
		if err := checkBase64(data); err != nil {
			return "", fieldErr(field+".data", "%s", err)
		}
		if !slices.Contains(anthropicImageTypes, src.MediaType) {
			return "", fieldErr(field+".media_type", "must be one of %s, got %s", strings.Join(anthropicImageTypes, ", "), strconv.Quote(clip(src.MediaType)))
		}
		return "data:" + src.MediaType + ";base64," + data, nil
	case "url":
		if src.URL == "" {
			return "", fieldErr(field+".url", "Field required")
		}
		if !IsRemoteImageURL(src.URL) {
			return "", fieldErr(field+".url", "must be an http or https URL (or send the image as a base64 source)")
		}
		t.req.RemoteImages = true
		return src.URL, nil
	}
	return "", fieldErr(field+".type", `must be "base64" or "url", got %s`, strconv.Quote(clip(src.Type)))
}

// toolResultText is a tool_result's content as text: a string, or its text
// blocks joined by newlines. An image in it is refused: a tool message
// carries text only.
func (t *anthropicTranslation) toolResultText(raw json.RawMessage, field string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	return t.joinText(raw, field, "\n", "a tool result's content can only be text here")
}

// assistantBlocks translates an assistant message's blocks into one
// assistant message: its text, and its tool_use blocks as tool_calls.
func (t *anthropicTranslation) assistantBlocks(blocks []json.RawMessage, field string) error {
	var texts []string
	var calls []map[string]any
	for j, raw := range blocks {
		bf := fmt.Sprintf("%s[%d]", field, j)
		b, err := decodeBlock(raw, bf)
		if err != nil {
			return err
		}
		switch b.Type {
		case "text":
			if b.Text == nil {
				return fieldErr(bf+".text", "Field required")
			}
			t.count(*b.Text)
			texts = append(texts, *b.Text)
		case "tool_use":
			if b.ID == "" {
				return fieldErr(bf+".id", "Field required")
			}
			if b.Name == "" {
				return fieldErr(bf+".name", "Field required")
			}
			input := b.Input
			if isNull(input) {
				input = json.RawMessage(`{}`)
			}
			if firstByte(input) != '{' {
				return fieldErr(bf+".input", "expected an object")
			}
			if !json.Valid(input) {
				return fieldErr(bf+".input", "expected an object")
			}
			args := string(compactJSON(input))
			t.count(b.Name)
			t.count(args)
			calls = append(calls, map[string]any{"id": b.ID, "type": "function",
				"function": map[string]any{"name": b.Name, "arguments": args}})
		case "thinking", "redacted_thinking":
			// An earlier answer's reasoning: accepted, not sent back.
		default:
			return fieldErr(bf+".type", "an assistant message's content block must be text, tool_use, thinking or redacted_thinking, got %s", strconv.Quote(clip(b.Type)))
		}
	}
	if len(texts) == 0 && len(calls) == 0 {
		return nil
	}
	msg := map[string]any{"role": "assistant", "content": strings.Join(texts, "")}
	if len(calls) > 0 {
		msg["tool_calls"] = calls
	}
	t.out.Messages = append(t.out.Messages, msg)
	return nil
}

// tools translates "tools" and "tool_choice".
func (t *anthropicTranslation) tools(raw, choice json.RawMessage) error {
	var names []string
	if !isNull(raw) {
		var defs []json.RawMessage
		if firstByte(raw) != '[' || json.Unmarshal(raw, &defs) != nil {
			return fieldErr("tools", "expected an array of tools")
		}
		for i, rd := range defs {
			field := fmt.Sprintf("tools[%d]", i)
			var d struct {
				Type        string          `json:"type"`
				Name        string          `json:"name"`
				Description string          `json:"description"`
				InputSchema json.RawMessage `json:"input_schema"`
			}
			if firstByte(rd) != '{' || json.Unmarshal(rd, &d) != nil {
				return fieldErr(field, "expected a tool object with a string name and description and an object input_schema")
			}
			switch {
			case d.Type == "" || d.Type == "custom":
			case isServerTool(d.Type):
				return fieldErr(field+".type", "the server tool %s (%s) is not supported: iop's providers run no Anthropic tools; define it as a custom tool with an input_schema", strconv.Quote(clip(d.Type)), strconv.Quote(clip(d.Name)))
			default:
				return fieldErr(field+".type", "unknown tool type %s", strconv.Quote(clip(d.Type)))
			}
			if d.Name == "" {
				return fieldErr(field+".name", "Field required")
			}
			if isNull(d.InputSchema) || firstByte(d.InputSchema) != '{' {
				return fieldErr(field+".input_schema", "Field required: a JSON schema object")
			}
			fn := map[string]any{"name": d.Name, "parameters": d.InputSchema}
			if d.Description != "" {
				fn["description"] = d.Description
			}
			def := map[string]any{"type": "function", "function": fn}
			b, err := json.Marshal(def)
			if err != nil {
				return fieldErr(field+".input_schema", "expected a JSON schema object")
			}
			t.count(string(b))
			t.out.Tools = append(t.out.Tools, def)
			names = append(names, d.Name)
		}
		t.req.Tools = len(t.out.Tools) > 0
	}
	if isNull(choice) {
		return nil
	}
	var c struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse *bool  `json:"disable_parallel_tool_use"`
	}
	if firstByte(choice) != '{' || json.Unmarshal(choice, &c) != nil {
		return fieldErr("tool_choice", "expected an object with a type")
	}
	t.req.OneToolCall = c.DisableParallelToolUse != nil && *c.DisableParallelToolUse
	switch c.Type {
	case "auto":
		if t.req.Tools {
			t.out.ToolChoice = "auto"
		}
	case "none":
		if t.req.Tools {
			t.out.ToolChoice = "none"
		}
	case "any":
		if !t.req.Tools {
			return fieldErr("tool_choice", `"any" needs tools`)
		}
		t.out.ToolChoice = "required"
		t.req.ToolChoiceAny = true
	case "tool":
		found := false
		for _, n := range names {
			found = found || n == c.Name
		}
		if !found {
			return fieldErr("tool_choice.name", "names no tool of the request: %s", strconv.Quote(clip(c.Name)))
		}
		t.out.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": c.Name}}
	default:
		return fieldErr("tool_choice.type", `must be "auto", "any", "tool" or "none", got %s`, strconv.Quote(clip(c.Type)))
	}
	return nil
}

// checkBase64 checks an image source's data: standard, padded base64 (as
// Ollama decodes an image, and as the edge checks an image of the chat
// API for Ollama providers), not a data: URL.
func checkBase64(data string) error {
	if strings.HasPrefix(data, "data:") {
		return errors.New("expected base64-encoded image data, not a data: URL")
	}
	if _, err := io.Copy(io.Discard, base64.NewDecoder(base64.StdEncoding, strings.NewReader(data))); err != nil {
		return fmt.Errorf("is not valid base64 (the standard alphabet, padded with =): %v", err)
	}
	return nil
}

func isServerTool(typ string) bool {
	for _, p := range anthropicServerTools {
		if strings.HasPrefix(typ, p+"_") || typ == p {
			return true
		}
	}
	return false
}

// sampling translates stop_sequences, temperature, top_p and top_k.
func (t *anthropicTranslation) sampling(top map[string]json.RawMessage) error {
	if raw := top["stop_sequences"]; !isNull(raw) {
		var stop []string
		if json.Unmarshal(raw, &stop) != nil {
			return fieldErr("stop_sequences", "expected an array of strings")
		}
		if len(stop) > maxStop {
			return fieldErr("stop_sequences", "at most %d stop sequences are supported, got %d", maxStop, len(stop))
		}
		if len(stop) > 0 {
			t.out.Stop = stop
			t.req.StopSequences = stop
		}
	}
	for _, f := range []struct {
		name string
		dst  **float64
	}{{"temperature", &t.out.Temperature}, {"top_p", &t.out.TopP}} {
		raw := top[f.name]
		if isNull(raw) {
			continue
		}
		var v float64
		if json.Unmarshal(raw, &v) != nil || v < 0 || v > 1 {
			return fieldErr(f.name, "must be a number from 0 to 1")
		}
		*f.dst = &v
	}
	if raw := top["top_k"]; !isNull(raw) {
		n, err := integer(raw, "top_k")
		if err != nil || n < 0 {
			return fieldErr("top_k", "expected a non-negative integer")
		}
		t.setExt("options.top_k", n)
	}
	return nil
}

// thinking translates "thinking": {"type": "enabled", "budget_tokens"} or
// {"type": "disabled"}.
func (t *anthropicTranslation) thinking(raw json.RawMessage) error {
	think := false
	if !isNull(raw) {
		var th struct {
			Type         string          `json:"type"`
			BudgetTokens json.RawMessage `json:"budget_tokens"`
		}
		if firstByte(raw) != '{' || json.Unmarshal(raw, &th) != nil {
			return fieldErr("thinking", `expected an object with a type "enabled" or "disabled"`)
		}
		switch th.Type {
		case "enabled":
			if isNull(th.BudgetTokens) {
				return fieldErr("thinking.budget_tokens", "Field required")
			}
			n, err := integer(th.BudgetTokens, "thinking.budget_tokens")
			if err != nil || n < minThinkingBudget {
				return fieldErr("thinking.budget_tokens", "must be an integer of at least %d", minThinkingBudget)
			}
			if t.req.MaxTokens > 0 && n >= int64(t.req.MaxTokens) {
				return fieldErr("thinking.budget_tokens", "`max_tokens` must be greater than `thinking.budget_tokens`")
			}
			think = true
		case "disabled":
		default:
			return fieldErr("thinking.type", `must be "enabled" or "disabled", got %s`, strconv.Quote(clip(th.Type)))
		}
	}
	t.req.Thinking = think
	t.setExt("think", think)
	return nil
}
