package translate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// ExtensionKey is the top-level member of an OpenAI client's request body
// by which it reaches Ollama-only settings: its value is the JSON form of
// OllamaFields, for example
//
//	{"model":"llama3","messages":[...],
//	 "iop_ollama":{"keep_alive":"24h","think":true,"options":{"num_ctx":8192}}}
//
// The edge takes the member out of the body (StripExtension) and sends its
// value to the node apart from it (the Dispatch's ollama_fields), as it
// does with an Ollama client's fields (Request.OllamaFields), so no
// provider sees the member; the node's Ollama adapter sets the fields on
// the Ollama request (ToOllamaChat ...). An Ollama client's own member of
// this name is ignored (it sends Ollama fields as themselves), and a node
// reads none from a body. Errors about the fields name this member.
const ExtensionKey = "iop_ollama"

// Operation is the OpenAI operation a translated request is for.
type Operation int

const (
	// Chat is POST /v1/chat/completions.
	Chat Operation = iota
	// Completion is POST /v1/completions (a raw prompt, no chat template).
	Completion
	// Embeddings is POST /v1/embeddings.
	Embeddings
)

// Request is an Ollama request translated to a canonical OpenAI request.
type Request struct {
	// Model is the model the client asked for.
	Model string
	// Operation says which OpenAI API Body is for.
	Operation Operation
	// Body is the canonical OpenAI JSON body. A chat or completions body
	// always streams ("stream": true, "stream_options":
	// {"include_usage": true}), whatever the client asked: the edge renders
	// a streamed answer as one object when the client did not want a
	// stream. An embeddings body asks for "encoding_format": "float".
	Body []byte
	// Stream is the client's own choice: "stream" absent or true (Ollama's
	// default) streams NDJSON. Embeddings never stream.
	Stream bool
	// LoadOnly marks a request with nothing to generate or embed (no
	// messages, an empty prompt or input): Ollama only loads the model, or
	// unloads it when Unload (keep_alive 0) is set. Body is then nil.
	LoadOnly, Unload bool
	// OllamaFields is the JSON form of the OllamaFields the request
	// carries apart from Body (nil when none): they reach Ollama providers
	// only.
	OllamaFields json.RawMessage
	// Extension lists the fields of OllamaFields, as paths ("keep_alive",
	// "options.num_ctx"), sorted.
	Extension []string
	// Dropped lists the fields dropped because no provider protocol can
	// carry them and dropping them keeps the answer's meaning ("template",
	// "system" of a raw prompt), sorted.
	Dropped []string
	// NoThinking is set when the client sent "think": false. Ollama then
	// answers without thinking, so the edge shows none of the reasoning an
	// OpenAI-compatible provider may still send (the canonical body asks
	// for no reasoning_effort then; see FromOllamaChat).
	NoThinking bool
	// Logprobs is set when the client asked for log probabilities
	// ("logprobs" true or "top_logprobs" above 0): only a provider that
	// speaks Ollama's API returns them in Ollama's shape.
	Logprobs bool
	// Thinking is set when the client asked for thinking: "think" true or
	// a level. The request then needs a model that can think (Ollama
	// refuses think for one that cannot: "does not support thinking").
	Thinking bool
	// EstimatedInputTokens is the prompt's characters / 4, rounded up
	// (Operation Completion only; a chat body is measured by the caller,
	// from InputChars and Tools).
	EstimatedInputTokens int
	// What the canonical body holds that the edge checks and measures, so
	// that it need not decode the body it was given (the client's was
	// decoded once, here):
	//
	// Roles are the roles of a chat's messages, in order.
	Roles []string
	// InputChars is the characters (code points) of the canonical body's
	// text: a chat's message text (content strings, text parts) and its
	// tool calls' function names and arguments; a completion's prompt and
	// suffix; the embeddings inputs.
	InputChars int
	// Images is set when a chat message carries an image.
	Images bool
	// Tools is a chat's "tools" value as the client sent it, nil when
	// absent or null (the canonical body has it compacted).
	Tools json.RawMessage
	// ReasoningEffort is the canonical chat body's reasoning_effort, ""
	// when it has none.
	ReasoningEffort string
	// Inputs and Dimensions are the canonical embeddings body's input and
	// dimensions (nil when it has none).
	Inputs     []string
	Dimensions *int64
	// Conversation is set for a non-raw /api/generate request without a
	// suffix: the turns of the "context" it sent back (none if it sent
	// none) and its prompt as the last user turn. The answer's "context"
	// is this with the answer's text as an assistant turn
	// (EncodeContext).
	Conversation []Turn
}

// FieldError is an Ollama request that cannot be translated: Field names
// the offending field ("messages[0].images[1]", "" for the body as a
// whole). It is a client error (HTTP 400).
type FieldError struct {
	Field, Message string
}

func (e *FieldError) Error() string {
	if e.Field == "" {
		return e.Message
	}
	return e.Field + ": " + e.Message
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// optionsMapped are the Ollama model options that have an OpenAI
// parameter (Ollama API doc, "Modelfile" valid parameters; OpenAI API
// reference, "Create chat completion").
var optionsMapped = map[string]string{
	"num_predict":       "max_tokens",
	"temperature":       "temperature",
	"top_p":             "top_p",
	"stop":              "stop",
	"seed":              "seed",
	"frequency_penalty": "frequency_penalty",
	"presence_penalty":  "presence_penalty",
}

// maxStop is how many stop sequences OpenAI's API accepts.
const maxStop = 4

// ollamaMessage is a message of POST /api/chat, as a client sends it
// (FromOllamaChat) and as a provider is sent it (ToOllamaChat).
type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Images    []string         `json:"images,omitempty"`
	ToolCalls []OllamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
	Thinking  string           `json:"thinking,omitempty"`
	// rawContent, when set, is the content as the client's JSON string
	// (quotes included, valid): appendJSON writes it instead of Content.
	rawContent []byte
}

// chatKnown and generateKnown are the top-level fields translated (or
// refused) rather than carried in Request.OllamaFields.
var (
	chatKnown     = []string{"model", "messages", "tools", "format", "options", "stream"}
	generateKnown = []string{"model", "prompt", "suffix", "system", "template", "context", "images", "raw", "format", "options", "stream"}
)

// canonicalChat is the canonical chat body, members in this order.
type canonicalChat struct {
	Model          string          `json:"model"`
	Messages       []any           `json:"messages,omitempty"`
	Prompt         *string         `json:"prompt,omitempty"` // completion only
	Suffix         string          `json:"suffix,omitempty"` // completion only
	Stream         bool            `json:"stream"`
	StreamOptions  map[string]bool `json:"stream_options"`
	MaxTokens      *int64          `json:"max_tokens,omitempty"`
	Temperature    *float64        `json:"temperature,omitempty"`
	TopP           *float64        `json:"top_p,omitempty"`
	Stop           []string        `json:"stop,omitempty"`
	Seed           *int64          `json:"seed,omitempty"`
	FrequencyPen   *float64        `json:"frequency_penalty,omitempty"`
	PresencePen    *float64        `json:"presence_penalty,omitempty"`
	ResponseFormat json.RawMessage `json:"response_format,omitempty"`
	// ReasoningEffort is "think" for OpenAI-compatible providers (chat
	// only; see thinkEffort).
	ReasoningEffort string          `json:"reasoning_effort,omitempty"`
	Tools           json.RawMessage `json:"tools,omitempty"`
}

// FromOllamaChat translates a POST /api/chat body (Ollama API doc,
// "Generate a chat completion") into a canonical chat completions body:
//
//	messages[].content, .images   content (a string, or text and image_url
//	                              parts whose URLs are base64 data: URLs,
//	                              the media type sniffed from the bytes)
//	messages[].tool_calls         tool_calls with ids "call_<m>_<i>" and
//	                              arguments as JSON text
//	messages[].tool_name          tool_call_id of the earliest unanswered
//	                              call of that function (any function if
//	                              the name is empty)
//	tools                         tools (the same shape)
//	format "json" / a schema      response_format json_object / json_schema
//	options.num_predict           max_tokens (≤ 0, Ollama's "no limit", is
//	                              left out; above 2^31-1 it is clamped)
//	options.temperature, top_p,   the OpenAI parameters of the same names
//	stop, seed, frequency_penalty,
//	presence_penalty
//	think                         reasoning_effort: "low", "medium" and
//	                              "high" stay; true and false set none
//	                              (thinkEffort says why) and false sets
//	                              Request.NoThinking; and, unchanged, in
//	                              OllamaFields, for Ollama providers
//	keep_alive, other options     carried in OllamaFields, values
//	and unknown fields            unchanged
//	messages[].thinking           in OllamaFields as "messages": one
//	                              object per message, {"thinking": ...} or
//	                              {}, for Ollama providers (ToOllamaChat);
//	                              an OpenAI-compatible provider does not get
//	                              it (DeepSeek's API refuses reasoning_content
//	                              in a request's messages)
//
// Errors are *FieldError: a body that is not a JSON object, a field of the
// wrong JSON type, a missing model, an image that is not base64, a format
// that is neither "json" nor a JSON schema, more than 4 stop sequences, a
// think that is not a boolean, "low", "medium" or "high" (Ollama refuses
// it too).
func FromOllamaChat(body []byte) (Request, error) {
	var in struct {
		Model    string            `json:"model"`
		Messages []json.RawMessage `json:"messages"`
		Tools    json.RawMessage   `json:"tools"`
	}
	top, err := decodeRequest(body, &in)
	if err != nil {
		return Request{}, err
	}
	t := &translation{top: top}
	req, out, err := t.common(in.Model, chatKnown)
	if err != nil {
		return Request{}, err
	}
	if len(in.Messages) == 0 {
		req.LoadOnly = true
		return req, nil
	}
	out.Messages, err = t.messages(in.Messages)
	if err != nil {
		return Request{}, err
	}
	if !isNull(in.Tools) {
		if firstByte(in.Tools) != '[' {
			return Request{}, fieldErr("tools", "expected an array of tools")
		}
		out.Tools = in.Tools
		req.Tools = in.Tools
	}
	req.Roles, req.InputChars, req.Images = t.roles, t.chars, t.images
	return t.finish(req, out)
}

// FromOllamaGenerate translates a POST /api/generate body (Ollama API doc,
// "Generate a completion"). Ollama applies the model's prompt template to
// the prompt (and system), as a chat does, so a plain request becomes a
// chat body: an optional system message, then one user message with the
// prompt and images. A raw request (no template) or one with a suffix
// (fill in the middle) becomes a completions body: prompt and suffix, and
// no system (dropped for a suffix request; refused for a raw one, as
// Ollama refuses it); "format" is sent
// both as response_format and, for Ollama providers, in OllamaFields.
// Options, keep_alive,
// think and unknown fields go as in FromOllamaChat (a completions body
// carries no reasoning_effort: think reaches Ollama providers only);
// "template" is dropped.
//
// A "context" iop gave in an earlier answer (EncodeContext: the
// conversation so far) becomes the chat's history, its turns as user and
// assistant messages between the system message and the new prompt, as
// Ollama puts a context's text before the new prompt; Request.Conversation
// is that history and the new prompt.
//
// Errors are *FieldError, as for FromOllamaChat, and also: a non-empty
// "context" that is not one iop gave (the token ids of another server,
// which iop, with no tokenizer, cannot read back: dropping it would answer
// without the conversation), a context, system or template on a raw
// request with a prompt (Ollama's "raw mode does not support template,
// system, or context", no field named) or a context on one with a
// suffix, and images on a raw or suffix request (a completions prompt
// cannot carry them).
func FromOllamaGenerate(body []byte) (Request, error) {
	var in struct {
		Model    string   `json:"model"`
		Prompt   string   `json:"prompt"`
		Suffix   string   `json:"suffix"`
		System   string   `json:"system"`
		Template string   `json:"template"`
		Context  []int64  `json:"context"`
		Images   []string `json:"images"`
		Raw      bool     `json:"raw"`
	}
	top, err := decodeRequest(body, &in)
	if err != nil {
		return Request{}, err
	}
	t := &translation{top: top}
	req, out, err := t.common(in.Model, generateKnown)
	if err != nil {
		return Request{}, err
	}
	var history []Turn
	switch {
	case len(in.Context) == 0:
	case in.Raw:
		return Request{}, fieldErr("context", "raw mode does not support template, system, or context")
	case in.Suffix != "":
		return Request{}, fieldErr("context", "a context cannot be sent with a suffix prompt")
	default:
		if history, err = DecodeContext(in.Context); err != nil {
			return Request{}, fieldErr("context", "%v: iop reads back only the context it gave (it has no tokenizer for another server's token ids); send the conversation to /api/chat instead", err)
		}
	}
	if in.Template != "" {
		t.dropped = append(t.dropped, "template")
	}
	if in.Prompt == "" && in.Suffix == "" {
		req.LoadOnly = true
		return req, nil
	}
	if in.Raw && (in.System != "" || in.Template != "") {
		// Ollama's own text (server/routes.go, GenerateHandler), which
		// it checks after a load-only request is answered.
		return Request{}, fieldErr("", "raw mode does not support template, system, or context")
	}
	if in.Raw || in.Suffix != "" {
		if len(in.Images) > 0 {
			return Request{}, fieldErr("images", "images cannot be sent with a raw or suffix prompt")
		}
		if in.System != "" {
			t.dropped = append(t.dropped, "system")
		}
		prompt := in.Prompt
		if in.Raw {
			// An Ollama provider must not apply the model's template
			// either: the completions body has no word for it.
			t.ext["raw"] = json.RawMessage("true")
			t.extension = append(t.extension, "raw")
		}
		if f, ok := top["format"]; ok && !isNull(f) {
			// Ollama's /api/generate takes format as it is.
			t.ext["format"] = f
			t.extension = append(t.extension, "format")
		}
		req.Operation = Completion
		out.Prompt, out.Suffix = &prompt, in.Suffix
		out.ReasoningEffort = "" // not a completions parameter
		req.InputChars = utf8.RuneCountInString(prompt) + utf8.RuneCountInString(in.Suffix)
		req.EstimatedInputTokens = (req.InputChars + 3) / 4
		return t.finish(req, out)
	}
	if in.System != "" {
		out.Messages = append(out.Messages, map[string]any{"role": "system", "content": in.System})
		req.Roles = append(req.Roles, "system")
		req.InputChars += utf8.RuneCountInString(in.System)
	}
	for _, turn := range history {
		out.Messages = append(out.Messages, map[string]any{"role": turn.Role, "content": turn.Content})
		req.Roles = append(req.Roles, turn.Role)
		req.InputChars += utf8.RuneCountInString(turn.Content)
	}
	user, err := userContent(in.Prompt, in.Images, "images")
	if err != nil {
		return Request{}, err
	}
	out.Messages = append(out.Messages, map[string]any{"role": "user", "content": user})
	req.Roles = append(req.Roles, "user")
	req.InputChars += utf8.RuneCountInString(in.Prompt)
	req.Images = len(in.Images) > 0
	req.Conversation = append(history, Turn{Role: "user", Content: in.Prompt})
	return t.finish(req, out)
}

// translation is the state of one request's translation.
type translation struct {
	top       map[string]json.RawMessage
	ext       map[string]json.RawMessage // fields for OllamaFields
	extOpts   map[string]json.RawMessage // options for OllamaFields
	extMsgs   []map[string]string        // per-message fields for OllamaFields ("thinking"), nil if none
	dropped   []string
	extension []string
	// What the canonical messages hold (Request.Roles, InputChars, Images).
	roles  []string
	chars  int
	images bool
}

// common translates the fields chat and generate share: model, stream,
// format, options and the fields carried in OllamaFields (every
// top-level field not in known).
func (t *translation) common(model string, known []string) (Request, *canonicalChat, error) {
	req, err := t.required(model, known)
	if err != nil {
		return Request{}, nil, err
	}
	if err := decodeField(t.top, "stream", &req.Stream); err != nil {
		return Request{}, nil, err
	}
	out := &canonicalChat{Model: model, Stream: true, StreamOptions: map[string]bool{"include_usage": true}}
	if out.ResponseFormat, err = responseFormat(t.top["format"]); err != nil {
		return Request{}, nil, err
	}
	if raw, ok := t.top["think"]; ok && !isNull(raw) {
		var think bool
		if out.ReasoningEffort, think, err = thinkEffort(raw); err != nil {
			return Request{}, nil, err
		}
		req.NoThinking, req.Thinking = !think, think
	}
	if err := t.options(out); err != nil {
		return Request{}, nil, err
	}
	if err := logprobs(t.top, &req); err != nil {
		return Request{}, nil, err
	}
	return req, out, nil
}

// maxTopLogprobs is the most top_logprobs Ollama returns per token.
const maxTopLogprobs = 20

// logprobs reads chat's and generate's "logprobs" (a boolean) and
// "top_logprobs" (an integer from 0 to 20; Ollama's own bounds and text),
// which stay in OllamaFields unchanged, and sets req.Logprobs when either
// asks for log probabilities (Ollama returns them for top_logprobs above 0
// even without logprobs).
func logprobs(top map[string]json.RawMessage, req *Request) error {
	var on bool
	if err := decodeField(top, "logprobs", &on); err != nil {
		return err
	}
	var n float64
	if err := decodeField(top, "top_logprobs", &n); err != nil {
		return err
	}
	if n != math.Trunc(n) {
		return fieldErr("top_logprobs", "expected an integer")
	}
	if n < 0 || n > maxTopLogprobs {
		return fieldErr("", "top_logprobs must be between 0 and 20")
	}
	req.Logprobs = on || n > 0
	return nil
}

// required checks the model and sets aside every top-level field not in
// known (keep_alive among them) for OllamaFields; keep_alive 0 sets Unload.
// An Ollama client's ExtensionKey member is ignored: it is not an Ollama
// field, and must not pass as the fields themselves.
func (t *translation) required(model string, known []string) (Request, error) {
	if strings.TrimSpace(model) == "" {
		return Request{}, fieldErr("model", "model is required")
	}
	req := Request{Model: model, Stream: true}
	t.ext = make(map[string]json.RawMessage)
	for k, v := range t.top {
		if slices.Contains(known, k) || k == ExtensionKey || isNull(v) {
			continue
		}
		t.ext[k] = v
		t.extension = append(t.extension, k)
	}
	if ka, ok := t.top["keep_alive"]; ok {
		req.Unload = isZeroKeepAlive(ka)
	}
	return req, nil
}

// finish sets req's OllamaFields and marshals out as req's body.
func (t *translation) finish(req Request, out any) (Request, error) {
	if c, ok := out.(*canonicalChat); ok {
		req.ReasoningEffort = c.ReasoningEffort
	}
	var err error
	if req.OllamaFields, err = t.extensionJSON(); err != nil {
		return Request{}, err
	}
	if req.Body, err = json.Marshal(out); err != nil {
		return Request{}, err
	}
	sort.Strings(t.extension)
	sort.Strings(t.dropped)
	req.Extension, req.Dropped = t.extension, t.dropped
	return req, nil
}

// thinkEffort maps Ollama's "think" (Ollama API doc; api.ThinkValue: a
// boolean, or "low", "medium" or "high") to OpenAI's reasoning_effort for
// an OpenAI-compatible provider; think reports whether thinking is on.
//
// A level stays a level. true sends none: a reasoning model reasons by
// default on every such server, while a level is refused by some for the
// very models that think (Ollama's own OpenAI API takes levels only for
// gpt-oss: "think value "medium" is not supported for this model" for
// qwen3 and the like, as its native API says for think "medium"). false
// sends none either: OpenAI's "none" is refused by servers whose model
// does not reason (and by older reasoning models), while Ollama takes
// think false for every model; the edge hides whatever reasoning comes
// back instead (Request.NoThinking), as Ollama shows none.
func thinkEffort(raw json.RawMessage) (effort string, think bool, err error) {
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return "", b, nil
	}
	var level string
	if json.Unmarshal(raw, &level) == nil {
		switch level {
		case "low", "medium", "high":
			return level, true, nil
		}
		return "", false, fieldErr("think", `must be true, false, "low", "medium" or "high", got %s`, strconv.Quote(clip(level)))
	}
	return "", false, fieldErr("think", `must be true, false, "low", "medium" or "high"`)
}

// extensionJSON is Request.OllamaFields: the fields set aside, with the
// options set aside as its "options" and the per-message fields as its
// "messages"; nil when there are none.
func (t *translation) extensionJSON() (json.RawMessage, error) {
	if t.extMsgs != nil {
		msgs, err := json.Marshal(t.extMsgs)
		if err != nil {
			return nil, err
		}
		t.ext["messages"] = msgs
	}
	if len(t.extOpts) > 0 {
		opts, err := json.Marshal(t.extOpts)
		if err != nil {
			return nil, err
		}
		t.ext["options"] = opts
	}
	if len(t.ext) == 0 {
		return nil, nil
	}
	return json.Marshal(t.ext)
}

// options maps the "options" object: the OpenAI-named ones onto out, the
// others into the extension.
func (t *translation) options(out *canonicalChat) error {
	raw := t.top["options"]
	if isNull(raw) {
		return nil
	}
	var opts map[string]json.RawMessage
	if err := json.Unmarshal(raw, &opts); err != nil || opts == nil {
		return fieldErr("options", "expected an object")
	}
	for name, v := range opts {
		if isNull(v) {
			continue
		}
		field := "options." + name
		if _, ok := optionsMapped[name]; !ok {
			if t.extOpts == nil {
				t.extOpts = make(map[string]json.RawMessage)
			}
			t.extOpts[name] = v
			t.extension = append(t.extension, field)
			continue
		}
		switch name {
		case "num_predict":
			n, err := integer(v, field)
			if err != nil {
				return err
			}
			if n > 0 {
				n = min(n, math.MaxInt32)
				out.MaxTokens = &n
			}
		case "seed":
			n, err := integer(v, field)
			if err != nil {
				return err
			}
			out.Seed = &n
		case "stop":
			var stop []string
			if err := json.Unmarshal(v, &stop); err != nil {
				var one string
				if json.Unmarshal(v, &one) != nil {
					return fieldErr(field, "expected an array of strings")
				}
				stop = []string{one}
			}
			if len(stop) > maxStop {
				return fieldErr(field, "at most %d stop sequences are supported, got %d", maxStop, len(stop))
			}
			out.Stop = stop
		default:
			var f float64
			if err := json.Unmarshal(v, &f); err != nil {
				return fieldErr(field, "expected a number")
			}
			switch name {
			case "temperature":
				out.Temperature = &f
			case "top_p":
				out.TopP = &f
			case "frequency_penalty":
				out.FrequencyPen = &f
			case "presence_penalty":
				out.PresencePen = &f
			}
		}
	}
	return nil
}

// messages translates the chat messages.
func (t *translation) messages(raw []json.RawMessage) ([]any, error) {
	out := make([]any, 0, len(raw))
	type pending struct{ id, name string }
	var open []pending // tool calls not yet answered, oldest first
	for i, r := range raw {
		field := fmt.Sprintf("messages[%d]", i)
		var m ollamaMessage
		if err := json.Unmarshal(r, &m); err != nil {
			return nil, typeError(err, field)
		}
		if m.Role == "" {
			return nil, fieldErr(field+".role", "each message must have a role")
		}
		if m.Thinking != "" {
			if t.extMsgs == nil {
				t.extMsgs = make([]map[string]string, len(raw))
				for j := range t.extMsgs {
					t.extMsgs[j] = map[string]string{}
				}
			}
			t.extMsgs[i]["thinking"] = m.Thinking
			t.extension = append(t.extension, field+".thinking")
		}
		msg := map[string]any{"role": m.Role}
		t.roles = append(t.roles, m.Role)
		t.chars += utf8.RuneCountInString(m.Content)
		t.images = t.images || len(m.Images) > 0
		content, err := userContent(m.Content, m.Images, field+".images")
		if err != nil {
			return nil, err
		}
		msg["content"] = content
		if len(m.ToolCalls) > 0 {
			calls := make([]map[string]any, 0, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				args, ok := argumentsText(c.Function.Arguments)
				if !ok {
					return nil, fieldErr(fmt.Sprintf("%s.tool_calls[%d].function.arguments", field, j), "expected a JSON object")
				}
				if c.Function.Name == "" {
					return nil, fieldErr(fmt.Sprintf("%s.tool_calls[%d].function.name", field, j), "each tool call must name its function")
				}
				t.chars += utf8.RuneCountInString(c.Function.Name) + utf8.RuneCountInString(args)
				id := fmt.Sprintf("call_%d_%d", i, j)
				open = append(open, pending{id, c.Function.Name})
				calls = append(calls, map[string]any{
					"id": id, "type": "function",
					"function": map[string]any{"name": c.Function.Name, "arguments": args},
				})
			}
			msg["tool_calls"] = calls
		}
		if m.Role == "tool" {
			for k, p := range open {
				if m.ToolName == "" || p.name == m.ToolName {
					msg["tool_call_id"] = p.id
					open = slices.Delete(open, k, k+1)
					break
				}
			}
		}
		out = append(out, msg)
	}
	return out, nil
}

// userContent is OpenAI message content: text alone, or a text part and
// one image_url part per image.
func userContent(text string, images []string, field string) (any, error) {
	if len(images) == 0 {
		return text, nil
	}
	parts := []map[string]any{{"type": "text", "text": text}}
	for i, img := range images {
		url, err := dataURL(img)
		if err != nil {
			return nil, fieldErr(fmt.Sprintf("%s[%d]", field, i), "%s", err)
		}
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": url}})
	}
	return parts, nil
}

// dataURL turns a base64 image (Ollama's "images" entries) into a data:
// URL, its media type sniffed from the bytes (http.DetectContentType, the
// WHATWG MIME Sniffing algorithm).
func dataURL(b64 string) (string, error) {
	b64 = strings.TrimSpace(b64)
	if b64 == "" {
		return "", errors.New("empty image")
	}
	if strings.HasPrefix(b64, "data:") {
		return b64, nil // already a data: URL
	}
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		if raw, err = base64.RawStdEncoding.DecodeString(b64); err != nil {
			return "", errors.New("expected base64-encoded image data")
		}
	}
	return "data:" + http.DetectContentType(raw) + ";base64," + b64, nil
}

// responseFormat maps Ollama's "format": "json" → json_object, a JSON
// schema (an object) → json_schema, "" or null → none.
func responseFormat(raw json.RawMessage) (json.RawMessage, error) {
	if isNull(raw) {
		return nil, nil
	}
	switch firstByte(raw) {
	case '"':
		var s string
		_ = json.Unmarshal(raw, &s)
		switch s {
		case "":
			return nil, nil
		case "json":
			return json.RawMessage(`{"type":"json_object"}`), nil
		}
		return nil, fieldErr("format", `expected "json" or a JSON schema object, got %s`, strconv.Quote(clip(s)))
	case '{':
		schema, err := json.Marshal(map[string]any{
			"type": "json_schema",
			"json_schema": map[string]any{
				"name":   "ollama_format",
				"schema": raw,
			},
		})
		return schema, err
	}
	return nil, fieldErr("format", `expected "json" or a JSON schema object`)
}

// isZeroKeepAlive reports whether keep_alive asks to unload the model: the
// number 0 or a zero duration ("0", "0s", "0m").
func isZeroKeepAlive(raw json.RawMessage) bool {
	var f float64
	if json.Unmarshal(raw, &f) == nil {
		return f == 0
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return false
	}
	s = strings.TrimRight(strings.TrimSpace(s), "hmsuµn")
	n, err := strconv.ParseFloat(s, 64)
	return err == nil && n == 0
}

// integer reads an integral JSON number (42 or 42.0, as Ollama's option
// decoding accepts) in the int64 range.
func integer(raw json.RawMessage, field string) (int64, error) {
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return 0, fieldErr(field, "expected an integer")
	}
	if f != math.Trunc(f) || f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, fieldErr(field, "expected an integer")
	}
	if n, err := strconv.ParseInt(string(bytes.TrimSpace(raw)), 10, 64); err == nil {
		return n, nil // exact for large literals
	}
	return int64(f), nil
}

// bodyDecodes counts decodeTop's decodes of a whole client body: a test
// hook (BodyDecodes).
var bodyDecodes atomic.Int64

// BodyDecodes is how many whole request bodies the FromOllama* functions
// decoded since the process started: one per call (a test hook, so the
// edge's tests can tell that an Ollama request's body is decoded once).
func BodyDecodes() int64 { return bodyDecodes.Load() }

// decodeTop decodes a body that must be one JSON object: the one decode
// of the client's whole body.
func decodeTop(body []byte) (map[string]json.RawMessage, error) {
	bodyDecodes.Add(1)
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, fieldErr("", "the request body must be a JSON object")
		}
		return nil, fieldErr("", "the request body is not valid JSON: %v", err)
	}
	if top == nil {
		return nil, fieldErr("", "the request body must be a JSON object, got null")
	}
	return top, nil
}

// decodeRequest decodes a body that must be one JSON object: its members,
// and its known fields into dst (decodeFields).
func decodeRequest(body []byte, dst any) (map[string]json.RawMessage, error) {
	top, err := decodeTop(body)
	if err != nil {
		return nil, err
	}
	return top, decodeFields(top, dst)
}

// decodeFields decodes the members of top that name a field of dst, a
// pointer to a struct of json-tagged fields, into it, as encoding/json
// decodes an object into the struct: a key matches a field's name in any
// case, members in key order (the order of the object json.Marshal writes
// of top, which this once re-encoded and decoded whole), the first wrong
// JSON type is the *FieldError naming the field, and the other members are
// still decoded. Each member's value is decoded once, from top.
func decodeFields(top map[string]json.RawMessage, dst any) error {
	v := reflect.ValueOf(dst).Elem()
	t := v.Type()
	var first error
	for _, k := range slices.Sorted(maps.Keys(top)) {
		for i := range t.NumField() {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
			if !strings.EqualFold(k, name) {
				continue
			}
			if err := json.Unmarshal(top[k], v.Field(i).Addr().Interface()); err != nil && first == nil {
				first = typeError(err, name)
			}
			break
		}
	}
	return first
}

// decodeField decodes top[name] into dst, leaving it alone when absent or
// null.
func decodeField(top map[string]json.RawMessage, name string, dst any) error {
	raw, ok := top[name]
	if !ok || isNull(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return typeError(err, name)
	}
	return nil
}

// typeError is a *FieldError for a json.Unmarshal error under prefix.
func typeError(err error, prefix string) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		field := typeErr.Field
		switch {
		case prefix != "" && field != "":
			field = prefix + "." + field
		case prefix != "":
			field = prefix
		}
		return fieldErr(field, "expected %s, got a JSON %s", goTypeName(typeErr.Type.Kind().String()), typeErr.Value)
	}
	return fieldErr(prefix, "invalid value: %v", err)
}

func goTypeName(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	case "int", "int64", "int32", "uint", "uint64":
		return "an integer"
	case "float64", "float32":
		return "a number"
	}
	return kind
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func firstByte(raw []byte) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// clip cuts a client value quoted in an error message to 256 bytes.
func clip(s string) string {
	const limit = 256
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut] + "…"
}
