package translate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"iop/internal/jsonscan"
)

// This file translates canonical OpenAI request bodies (OpenAI API
// reference, /v1/chat/completions, /v1/completions, /v1/embeddings) into
// Ollama's native ones (Ollama API doc, /api/chat, /api/generate,
// /api/embed): the way to an Ollama provider. FromOllamaChat and its
// siblings (ollama_request.go) go the other way.

// openAISampling holds the OpenAI sampling fields chat and completions
// share.
type openAISampling struct {
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"` // string | []string | null
	Seed                *int64          `json:"seed"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	PresencePenalty     *float64        `json:"presence_penalty"`
}

// ollamaOptions is Ollama's "options" object (model parameters). Pointers
// keep an explicit zero, such as temperature 0, distinct from unset.
type ollamaOptions struct {
	NumPredict       *int     `json:"num_predict,omitempty"`
	Temperature      *float64 `json:"temperature,omitempty"`
	TopP             *float64 `json:"top_p,omitempty"`
	Stop             []string `json:"stop,omitempty"`
	Seed             *int64   `json:"seed,omitempty"`
	FrequencyPenalty *float64 `json:"frequency_penalty,omitempty"`
	PresencePenalty  *float64 `json:"presence_penalty,omitempty"`
}

// options maps s to Ollama options (max_completion_tokens wins over
// max_tokens as num_predict); nil when s sets nothing.
func (s openAISampling) options() (*ollamaOptions, error) {
	o := &ollamaOptions{
		NumPredict:       s.MaxTokens,
		Temperature:      s.Temperature,
		TopP:             s.TopP,
		Seed:             s.Seed,
		FrequencyPenalty: s.FrequencyPenalty,
		PresencePenalty:  s.PresencePenalty,
	}
	if s.MaxCompletionTokens != nil {
		o.NumPredict = s.MaxCompletionTokens
	}
	stop, err := stringOrStrings(s.Stop, "stop")
	if err != nil {
		return nil, err
	}
	o.Stop = stop
	if o.NumPredict == nil && o.Temperature == nil && o.TopP == nil && o.Stop == nil &&
		o.Seed == nil && o.FrequencyPenalty == nil && o.PresencePenalty == nil {
		return nil, nil
	}
	return o, nil
}

// stringOrStrings decodes a JSON string or array of strings; null or absent
// is nil. Errors are *FieldError naming field.
func stringOrStrings(raw json.RawMessage, field string) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, fieldErr(field, "want a string or an array of strings")
	}
	return many, nil
}

// ---- chat ----

type openAIChatRequest struct {
	openAISampling
	N              *int            `json:"n"`
	Messages       []openAIMessage `json:"messages"`
	ResponseFormat *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	Logprobs          *bool           `json:"logprobs"`
	TopLogprobs       json.RawMessage `json:"top_logprobs"` // integer | null
	openAIReasoning
}

// openAIReasoning is a request's reasoning setting: OpenAI's
// "reasoning_effort", or the "reasoning" object of OpenRouter and Ollama's
// OpenAI API ({"effort"}, OpenRouter's {"enabled"}).
type openAIReasoning struct {
	ReasoningEffort *string `json:"reasoning_effort"`
	Reasoning       *struct {
		Effort  *string `json:"effort"`
		Enabled *bool   `json:"enabled"`
	} `json:"reasoning"`
}

// think maps the reasoning setting to Ollama's "think" (nil: none set), as
// Ollama's own OpenAI API does (openai.FromChatRequest: "reasoning.effort"
// before "reasoning_effort"; "none" is false, a level stays), and also
// OpenAI's levels Ollama lacks to the nearest it has: "minimal" is "low",
// "xhigh" is "high". Errors are *FieldError for another value.
func (r openAIReasoning) think() (json.RawMessage, error) {
	effort, field := r.ReasoningEffort, "reasoning_effort"
	if r.Reasoning != nil {
		switch {
		case r.Reasoning.Effort != nil:
			effort, field = r.Reasoning.Effort, "reasoning.effort"
		case r.Reasoning.Enabled != nil:
			return json.Marshal(*r.Reasoning.Enabled)
		}
	}
	if effort == nil {
		return nil, nil
	}
	switch *effort {
	case "none":
		return json.RawMessage(`false`), nil
	case "minimal":
		return json.RawMessage(`"low"`), nil
	case "low", "medium", "high":
		return json.Marshal(*effort)
	case "xhigh":
		return json.RawMessage(`"high"`), nil
	}
	return nil, fieldErr(field, `must be one of "none", "minimal", "low", "medium", "high", "xhigh", got %q`, clip(*effort))
}

type openAIMessage struct {
	Role       string           `json:"role"`
	Content    json.RawMessage  `json:"content"` // string | []part | null
	Name       string           `json:"name"`
	ToolCalls  []openAIToolCall `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
	// ReasoningContent and Reasoning are an earlier answer's reasoning
	// (vLLM and DeepSeek; Ollama's OpenAI API and OpenRouter): a string,
	// else ignored.
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Reasoning        json.RawMessage `json:"reasoning"`
}

// openAIToolCall is one entry of an OpenAI message's "tool_calls" as a
// request carries it: arguments are JSON text.
type openAIToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"` // JSON text
	} `json:"function"`
}

// openAIPart is one part of OpenAI message content (OpenAI API
// reference, "Create chat completion", content parts).
type openAIPart struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ImageURL json.RawMessage `json:"image_url"` // {"url": ...} | "url"
}

type ollamaChatRequest struct {
	Model    string          `json:"model"`
	Messages []ollamaMessage `json:"messages,omitempty"` // never empty
	Stream   bool            `json:"stream"`
	Format   json.RawMessage `json:"format,omitempty"`
	Options  *ollamaOptions  `json:"options,omitempty"`
	Tools    json.RawMessage `json:"tools,omitempty"`
	Think    json.RawMessage `json:"think,omitempty"`
	// hint is the size of the client's body, for appendJSON's buffer.
	hint int
}

func (r *ollamaChatRequest) sizeHint() int { return r.hint + 128 }

// ToOllamaChat translates an OpenAI chat completions body into an Ollama
// /api/chat body for model, always streaming:
//
//	messages[].role           the same, but "developer" is "system" (chat
//	                          templates render only system)
//	messages[].content        content (text parts joined by newlines) and
//	                          images (base64 data: URLs only; the node
//	                          fetches nothing on a client's behalf)
//	messages[].tool_calls     tool_calls, arguments as an object
//	messages[].reasoning_content, thinking (an earlier answer's reasoning)
//	.reasoning
//	tool message              tool_name: its "name", else the function of
//	                          the call its tool_call_id answers
//	tools, tool_choice        tools, as tool_choice allows (toolsFor); a
//	                          forced call: format and a system message
//	                          instead (forced_tool.go; ToOllamaChatRequest)
//	max_completion_tokens,    options.num_predict
//	max_tokens
//	temperature, top_p, stop, options of the same names
//	seed, frequency_penalty,
//	presence_penalty
//	response_format           format: "json" (json_object) or the schema
//	                          (json_schema)
//	reasoning_effort,         think (openAIReasoning.think), unless
//	reasoning.effort          fields set think itself
//
// fields (nil: none) are set on the Ollama body as OllamaFields.encode
// says: a field the translation sets keeps the translated value. body is
// decoded once and the result encoded once, fields or not.
//
// Errors are *FieldError naming the field: a body that is not a chat
// completions object, no messages, a message without a role, content that
// is neither a string nor parts, a part other than text or a data: image
// (a remote image URL is refused, saying to send a data URL), tool call
// arguments that are not JSON, an unknown response_format type, a
// reasoning effort of another value, and the settings Ollama cannot honour
// and whose loss would change the answer: "n" above 1 (Ollama answers one
// choice per request), parallel_tool_calls false without a forced call
// (Ollama cannot keep a model to one call), and logprobs true or
// top_logprobs (the translation returns none). A request that forces a
// call loses that to ToOllamaChat: use ToOllamaChatRequest.
func ToOllamaChat(body []byte, model string, fields *OllamaFields) ([]byte, error) {
	chat, err := ToOllamaChatRequest(body, model, fields)
	return chat.Body, err
}

// OllamaChat is an Ollama /api/chat body (ToOllamaChatRequest) and how its
// answer is to be read.
type OllamaChat struct {
	Body []byte
	// Forced is set when the request forced a tool call: the answer's
	// text is that call (ForcedCall.Call), not text for the client.
	Forced *ForcedCall
}

// ToOllamaChatRequest is ToOllamaChat, also saying how to read the answer:
// a request whose tool_choice forces a call gets no tools but a format
// admitting only the call (forced_tool.go), and OllamaChat.Forced.
func ToOllamaChatRequest(body []byte, model string, fields *OllamaFields) (OllamaChat, error) {
	var in openAIChatRequest
	if !scanChatRequest(body, &in) {
		in = openAIChatRequest{}
		if err := json.Unmarshal(body, &in); err != nil {
			return OllamaChat{}, fieldErr("", "request body is not a valid chat completions object")
		}
	}
	if len(in.Messages) == 0 {
		return OllamaChat{}, fieldErr("messages", "at least one message is required")
	}
	switch {
	case in.Logprobs != nil && *in.Logprobs:
		return OllamaChat{}, fieldErr("logprobs", "not supported by this provider")
	case !isNull(in.TopLogprobs):
		return OllamaChat{}, fieldErr("top_logprobs", "not supported by this provider")
	}
	if err := oneChoice(in.N); err != nil {
		return OllamaChat{}, err
	}
	opts, err := in.options()
	if err != nil {
		return OllamaChat{}, err
	}
	out := ollamaChatRequest{Model: model, Stream: true, Options: opts, hint: len(body)}
	forced := false
	if out.Tools, forced, err = toolsFor(in.Tools, in.ToolChoice, in.ParallelToolCalls); err != nil {
		return OllamaChat{}, err
	}
	if !fields.has("think") {
		if out.Think, err = in.think(); err != nil {
			return OllamaChat{}, err
		}
	}
	if rf := in.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			out.Format = json.RawMessage(`"json"`)
		case "json_schema":
			if rf.JSONSchema == nil || isNull(rf.JSONSchema.Schema) {
				return OllamaChat{}, fieldErr("response_format", "json_schema needs a schema")
			}
			out.Format = rf.JSONSchema.Schema
		default:
			return OllamaChat{}, fieldErr("response_format", "unsupported type %q", rf.Type)
		}
	}
	toolNames := make(map[string]string)                        // tool call id -> function name
	out.Messages = make([]ollamaMessage, 0, len(in.Messages)+1) // +1: forceCall's
	for i, m := range in.Messages {
		om := ollamaMessage{Role: m.Role, Thinking: reasoningText(m.ReasoningContent, m.Reasoning)}
		switch m.Role {
		case "":
			return OllamaChat{}, fieldErr(fmt.Sprintf("messages[%d]", i), "role is required")
		case "developer":
			om.Role = "system"
		}
		if om.rawContent, om.Content, om.Images, err = messageContent(m.Content, i); err != nil {
			return OllamaChat{}, err
		}
		for _, tc := range m.ToolCalls {
			args := json.RawMessage(tc.Function.Arguments)
			if strings.TrimSpace(tc.Function.Arguments) == "" {
				args = json.RawMessage(`{}`)
			} else if _, _, ok := validJSON(args); !ok {
				return OllamaChat{}, fieldErr(fmt.Sprintf("messages[%d]", i), "tool call arguments are not JSON")
			}
			if om.ToolCalls == nil {
				om.ToolCalls = make([]OllamaToolCall, 0, len(m.ToolCalls))
			}
			om.ToolCalls = append(om.ToolCalls, OllamaToolCall{Function: OllamaFunctionCall{Name: tc.Function.Name, Arguments: args}})
			if tc.ID != "" {
				toolNames[tc.ID] = tc.Function.Name
			}
		}
		if m.Role == "tool" {
			om.ToolName = m.Name
			if om.ToolName == "" {
				om.ToolName = toolNames[m.ToolCallID]
			}
		}
		out.Messages = append(out.Messages, om)
	}
	chat := OllamaChat{}
	if forced {
		if chat.Forced, err = forceCall(&out, out.Tools); err != nil {
			return OllamaChat{}, err
		}
	}
	chat.Body, err = fields.encode(&out, out.has, &out.Options, &out.Messages)
	return chat, err
}

// has reports whether r's encoding has the top-level member name.
func (r *ollamaChatRequest) has(name string) bool {
	switch name {
	case "model", "messages", "stream":
		return true
	case "format":
		return len(r.Format) > 0
	case "options":
		return r.Options != nil
	case "tools":
		return len(r.Tools) > 0
	case "think":
		return len(r.Think) > 0
	}
	return false
}

// reasoningText is a message's reasoning: reasoning_content when it is a
// non-empty string, else reasoning when it is a string.
func reasoningText(content, reasoning json.RawMessage) string {
	if s, ok := rawString(content); ok && s != "" {
		return s
	}
	if s, ok := rawString(reasoning); ok {
		return s
	}
	return ""
}

// toolsFor is the "tools" an Ollama provider gets for an OpenAI request's
// tools, tool_choice and parallel_tool_calls (OpenAI API reference, "Create
// chat completion"), and whether the answer must be a call of one of them
// (forced; Ollama has no tool_choice, so ToOllamaChatRequest constrains
// the answer to the call instead, forced_tool.go):
//
//	tool_choice absent, "auto"       the tools as sent
//	"none"                           no tools: the model cannot call one
//	"required"                       the tools, forced
//	{"type":"function",              only that function's tool, forced
//	 "function":{"name":N}}
//	{"type":"allowed_tools",         only those tools; forced when the
//	 "allowed_tools":{"mode":M,      mode is "required"
//	 "tools":[...]}}
//
// Refused (*FieldError): another tool_choice, a named function that is not
// among the tools, "required" without tools, allowed tools of mode
// "required" listing no function, and parallel_tool_calls false
// without a forced call (Ollama cannot keep a model to one call per turn;
// a forced answer is one call). An OpenAI-compatible provider gets all of
// these as sent.
func toolsFor(tools, choice json.RawMessage, parallel *bool) (json.RawMessage, bool, error) {
	kept, forced, err := choiceTools(tools, choice)
	if err != nil {
		return nil, false, err
	}
	if parallel != nil && !*parallel && !forced && len(kept) > 0 {
		return nil, false, fieldErr("parallel_tool_calls", "false cannot be honoured by this provider (Ollama may answer with several tool calls in one turn); leave it out, or use a model an OpenAI-compatible provider serves")
	}
	if forced && len(kept) == 0 {
		return nil, false, fieldErr("tool_choice", "forces a tool call, but the request has no function tools")
	}
	return kept, forced, nil
}

// choiceTools is toolsFor without parallel_tool_calls.
func choiceTools(tools, choice json.RawMessage) (json.RawMessage, bool, error) {
	if isNull(choice) {
		return nonNullRaw(tools), false, nil
	}
	var mode string
	if json.Unmarshal(choice, &mode) == nil {
		switch mode {
		case "auto":
			return nonNullRaw(tools), false, nil
		case "none":
			return nil, false, nil
		case "required":
			return nonNullRaw(tools), true, nil
		}
		return nil, false, fieldErr("tool_choice", `must be "none", "auto", "required" or an object naming a function, got %q`, clip(mode))
	}
	var obj struct {
		Type     string `json:"type"`
		Function *struct {
			Name string `json:"name"`
		} `json:"function"`
		AllowedTools *struct {
			Mode  string `json:"mode"`
			Tools []struct {
				Type     string `json:"type"`
				Function *struct {
					Name string `json:"name"`
				} `json:"function"`
			} `json:"tools"`
		} `json:"allowed_tools"`
	}
	if err := json.Unmarshal(choice, &obj); err != nil {
		return nil, false, fieldErr("tool_choice", `must be "none", "auto", "required" or an object naming a function`)
	}
	var names []string
	forced := false
	switch {
	case obj.Type == "function" && obj.Function != nil && obj.Function.Name != "":
		names, forced = []string{obj.Function.Name}, true
	case obj.Type == "allowed_tools" && obj.AllowedTools != nil:
		switch obj.AllowedTools.Mode {
		case "", "auto":
		case "required":
			forced = true
		default:
			return nil, false, fieldErr("tool_choice.allowed_tools.mode", `must be "auto" or "required", got %q`, clip(obj.AllowedTools.Mode))
		}
		for _, t := range obj.AllowedTools.Tools {
			if t.Function != nil && t.Function.Name != "" {
				names = append(names, t.Function.Name)
			}
		}
		if forced && len(names) == 0 {
			return nil, false, fieldErr("tool_choice.allowed_tools.tools", "lists no function tool, so mode \"required\" has no call to force; list at least one of the request's function tools")
		}
	default:
		return nil, false, fieldErr("tool_choice", "a tool_choice of type %q is not supported by this provider; name a function: {\"type\":\"function\",\"function\":{\"name\":...}}", clip(obj.Type))
	}
	kept, err := onlyTools(tools, names)
	return kept, forced, err
}

// onlyTools returns the function tools of tools named in names, in their
// order; a name without a tool is a *FieldError.
func onlyTools(tools json.RawMessage, names []string) (json.RawMessage, error) {
	var all []json.RawMessage
	if !isNull(tools) {
		if err := json.Unmarshal(tools, &all); err != nil {
			return nil, fieldErr("tools", "expected an array of tools")
		}
	}
	var kept []json.RawMessage
	found := make(map[string]bool, len(names))
	for _, raw := range all {
		var t struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(raw, &t) == nil && slices.Contains(names, t.Function.Name) {
			kept = append(kept, raw)
			found[t.Function.Name] = true
		}
	}
	for _, n := range names {
		if !found[n] {
			return nil, fieldErr("tool_choice", "names the function %q, which is not among the request's tools", clip(n))
		}
	}
	if len(kept) == 0 {
		return nil, nil
	}
	return json.Marshal(kept)
}

// nonNullRaw is raw, or nil when it is absent or null.
func nonNullRaw(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return nil
	}
	return raw
}

// messageContent flattens OpenAI message content: a string, or an array of
// parts whose text parts are joined by newlines and whose image_url parts,
// which must be base64 data: URLs, become Ollama images. A string comes
// back as quoted, the JSON string itself (raw without white space around
// it), for appendRawString; the others as text. raw is one valid JSON
// value (decoded from the body), so a string needs no second look.
func messageContent(raw json.RawMessage, i int) (quoted []byte, text string, images []string, err error) {
	if isNull(raw) {
		return nil, "", nil, nil
	}
	if q := bytes.TrimSpace(raw); q[0] == '"' {
		return q, "", nil, nil
	}
	var parts []openAIPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, "", nil, fieldErr(fmt.Sprintf("messages[%d].content", i), "want a string or an array of parts")
	}
	var texts []string
	for j, p := range parts {
		field := fmt.Sprintf("messages[%d].content[%d]", i, j)
		switch p.Type {
		case "text":
			texts = append(texts, p.Text)
		case "image_url":
			img, err := imageData(p.ImageURL)
			if err != nil {
				return nil, "", nil, fieldErr(field+".image_url", "%s", err)
			}
			images = append(images, img)
		default:
			return nil, "", nil, fieldErr(field, "unsupported part type %q", p.Type)
		}
	}
	return nil, strings.Join(texts, "\n"), images, nil
}

// rawString is the value of raw when it is one JSON string, decoded as
// encoding/json decodes it, in one pass and without reflection
// (jsonscan); ok is false for any other value.
func rawString(raw json.RawMessage) (string, bool) {
	raw, ok := jsonString(raw)
	if !ok {
		return "", false
	}
	var b strings.Builder
	b.Grow(len(raw) - 2)
	jsonscan.Decode(raw, func(p []byte) { b.Write(p) })
	return b.String(), true
}

// jsonString is raw without the white space around it when that is one
// valid JSON string (quotes included); ok is false for any other value.
func jsonString(raw json.RawMessage) (quoted []byte, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return nil, false
	}
	if end, _ := jsonscan.String(raw, 0); end != len(raw) {
		return nil, false
	}
	return raw, true
}

// imageData returns the base64 payload of an image_url part, which is
// {"url": "data:<type>;base64,<payload>"} or that URL as a bare string.
// Remote (http, https) URLs are refused: Ollama takes image bytes only, and
// the node fetches nothing on a client's behalf (a URL would let a client
// make it reach any address its network can).
func imageData(raw json.RawMessage) (string, error) {
	var ref struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		if err := json.Unmarshal(raw, &ref.URL); err != nil {
			return "", fmt.Errorf(`want {"url": ...}`)
		}
	}
	if IsRemoteImageURL(ref.URL) {
		return "", fmt.Errorf(`remote image URLs are not fetched for this provider (Ollama takes image bytes only); send the image inline as a base64 data URL, "data:image/png;base64,..."`)
	}
	meta, payload, ok := strings.Cut(ref.URL, ",")
	if !ok || !strings.HasPrefix(meta, "data:") || !strings.HasSuffix(meta, ";base64") {
		return "", fmt.Errorf(`only base64 data URLs are supported, "data:image/png;base64,..."`)
	}
	if payload == "" {
		return "", fmt.Errorf("empty image data")
	}
	// Ollama decodes images as standard base64 (encoding/json's []byte) and
	// refuses anything else 400; checked here, as the Ollama API's own
	// route does, so the client learns which image (a data URL of "!!!"
	// must not be answered 200 without the image).
	if _, err := io.Copy(io.Discard, base64.NewDecoder(base64.StdEncoding, strings.NewReader(payload))); err != nil {
		return "", fmt.Errorf("image data is not valid base64: %v", err)
	}
	return payload, nil
}

// IsRemoteImageURL reports whether an image_url part's URL is a remote
// one (http: or https:, in any case), which only a provider that fetches
// URLs itself (an OpenAI-compatible one) can take.
func IsRemoteImageURL(url string) bool {
	scheme, _, ok := strings.Cut(url, ":")
	return ok && (strings.EqualFold(scheme, "http") || strings.EqualFold(scheme, "https"))
}

// oneChoice refuses an "n" above 1: Ollama answers one choice per
// request.
func oneChoice(n *int) error {
	if n != nil && *n > 1 {
		return fieldErr("n", "this provider answers one choice per request, got n=%d", *n)
	}
	return nil
}

// ---- completions ----

type openAICompletionRequest struct {
	openAISampling
	Prompt   json.RawMessage `json:"prompt"` // string | [string]
	Suffix   string          `json:"suffix"`
	N        *int            `json:"n"`
	BestOf   *int            `json:"best_of"`
	Echo     *bool           `json:"echo"`
	Logprobs json.RawMessage `json:"logprobs"` // integer | null
	openAIReasoning
}

type ollamaGenerateRequest struct {
	Model   string          `json:"model"`
	Prompt  string          `json:"prompt"`
	Suffix  string          `json:"suffix,omitempty"`
	Stream  bool            `json:"stream"`
	Options *ollamaOptions  `json:"options,omitempty"`
	Think   json.RawMessage `json:"think,omitempty"`
}

// OpenAIPrompt returns the prompt of an OpenAI completions body: a string,
// or an array of exactly one string (one run, one answer). Errors are
// *FieldError: a body that is not an object, a prompt of another shape
// (token arrays included) or count.
func OpenAIPrompt(body []byte) (string, error) {
	var in struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return "", fieldErr("", "request body is not a valid completions object")
	}
	return onePrompt(in.Prompt)
}

func onePrompt(raw json.RawMessage) (string, error) {
	prompts, err := stringOrStrings(raw, "prompt")
	if err != nil {
		return "", err
	}
	if len(prompts) != 1 {
		return "", fieldErr("prompt", "want one string, got %d", len(prompts))
	}
	return prompts[0], nil
}

// ToOllamaGenerate translates an OpenAI completions body into an Ollama
// /api/generate body for model, always streaming: the prompt (see
// OpenAIPrompt), suffix, and the sampling options and reasoning effort as
// ToOllamaChat maps them. Errors are *FieldError naming the field, also
// for the fields Ollama cannot honour and whose loss would change the
// answer: echo true, logprobs, and n or best_of above 1. fields are set
// on the Ollama body as ToOllamaChat sets them.
func ToOllamaGenerate(body []byte, model string, fields *OllamaFields) ([]byte, error) {
	var in openAICompletionRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fieldErr("", "request body is not a valid completions object")
	}
	switch {
	case in.Echo != nil && *in.Echo:
		return nil, fieldErr("echo", "not supported by this provider")
	case !isNull(in.Logprobs):
		return nil, fieldErr("logprobs", "not supported by this provider")
	case in.BestOf != nil && *in.BestOf > 1:
		return nil, fieldErr("best_of", "this provider answers one choice per request, got best_of=%d", *in.BestOf)
	}
	if err := oneChoice(in.N); err != nil {
		return nil, err
	}
	prompt, err := onePrompt(in.Prompt)
	if err != nil {
		return nil, err
	}
	opts, err := in.options()
	if err != nil {
		return nil, err
	}
	out := ollamaGenerateRequest{Model: model, Prompt: prompt, Suffix: in.Suffix, Stream: true, Options: opts}
	if !fields.has("think") {
		if out.Think, err = in.think(); err != nil {
			return nil, err
		}
	}
	return fields.encode(&out, out.has, &out.Options, nil)
}

// has reports whether r's encoding has the top-level member name.
func (r *ollamaGenerateRequest) has(name string) bool {
	switch name {
	case "model", "prompt", "stream":
		return true
	case "suffix":
		return r.Suffix != ""
	case "options":
		return r.Options != nil
	case "think":
		return len(r.Think) > 0
	}
	return false
}

// ---- embeddings ----

type ollamaEmbedRequest struct {
	Model      string   `json:"model"`
	Input      []string `json:"input"`
	Dimensions *int     `json:"dimensions,omitempty"`
}

// ToOllamaEmbed translates an OpenAI embeddings body into an Ollama
// /api/embed body for model: input (a string or strings; always an array
// for Ollama) and dimensions. It also returns the number of inputs.
// encoding_format is the edge's to apply. Errors are *FieldError: token
// array inputs, no input. fields are set on the Ollama body as
// ToOllamaChat sets them (its "options" among them: the translation sets
// none).
func ToOllamaEmbed(body []byte, model string, fields *OllamaFields) ([]byte, int, error) {
	var in struct {
		Input      json.RawMessage `json:"input"` // string | []string
		Dimensions *int            `json:"dimensions"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, 0, fieldErr("", "request body is not a valid embeddings object")
	}
	inputs, err := stringOrStrings(in.Input, "input")
	if err != nil {
		return nil, 0, err
	}
	if len(inputs) == 0 {
		return nil, 0, fieldErr("input", "at least one input is required")
	}
	req := ollamaEmbedRequest{Model: model, Input: inputs, Dimensions: in.Dimensions}
	out, err := fields.encode(&req, req.has, nil, nil)
	return out, len(inputs), err
}

// has reports whether r's encoding has the top-level member name.
func (r *ollamaEmbedRequest) has(name string) bool {
	switch name {
	case "model", "input":
		return true
	case "dimensions":
		return r.Dimensions != nil
	}
	return false
}
