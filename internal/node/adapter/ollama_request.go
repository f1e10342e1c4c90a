package adapter

import (
	"bytes"
	"encoding/json"
	"strings"
)

// This file translates OpenAI request bodies (OpenAI API reference,
// /v1/chat/completions, /v1/completions, /v1/embeddings) into Ollama's
// native ones (Ollama API doc, /api/chat, /api/generate, /api/embed).

// sampling holds the OpenAI sampling fields chat and completions share.
type sampling struct {
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

// options maps s to Ollama options; nil when s sets nothing.
func (s sampling) options() (*ollamaOptions, error) {
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
// is nil.
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
		return nil, badRequest("%s: want a string or an array of strings", field)
	}
	return many, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// ---- chat ----

type openAIChatRequest struct {
	sampling
	N              *int            `json:"n"`
	Messages       []openAIMessage `json:"messages"`
	ResponseFormat *struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	} `json:"response_format"`
	Tools json.RawMessage `json:"tools"`
}

type openAIMessage struct {
	Role       string           `json:"role"`
	Content    json.RawMessage  `json:"content"` // string | []part | null
	Name       string           `json:"name"`
	ToolCalls  []openAIToolCall `json:"tool_calls"`
	ToolCallID string           `json:"tool_call_id"`
}

type openAIToolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"` // JSON text
	} `json:"function"`
}

type openAIPart struct {
	Type     string          `json:"type"`
	Text     string          `json:"text"`
	ImageURL json.RawMessage `json:"image_url"` // {"url": ...} | "url"
}

type ollamaChatRequest struct {
	Model    string          `json:"model"`
	Messages []ollamaMessage `json:"messages"`
	Stream   bool            `json:"stream"`
	Format   json.RawMessage `json:"format,omitempty"`
	Options  *ollamaOptions  `json:"options,omitempty"`
	Tools    json.RawMessage `json:"tools,omitempty"`
}

type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Images    []string         `json:"images,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
}

type ollamaToolCall struct {
	Function ollamaFunctionCall `json:"function"`
}

type ollamaFunctionCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"` // an object, not a string
}

// chatToOllama translates an OpenAI chat completions body into an Ollama
// /api/chat body for model, always streaming; "n" above 1 is refused.
// Errors are *Error of kind ErrBadRequest.
func chatToOllama(body []byte, model string) ([]byte, error) {
	var in openAIChatRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("request body is not a valid chat completions object")
	}
	if len(in.Messages) == 0 {
		return nil, badRequest("messages: at least one message is required")
	}
	if err := oneChoice(in.N); err != nil {
		return nil, err
	}
	opts, err := in.options()
	if err != nil {
		return nil, err
	}
	out := ollamaChatRequest{Model: model, Stream: true, Options: opts}
	if !isNull(in.Tools) {
		out.Tools = in.Tools
	}
	if rf := in.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			out.Format = json.RawMessage(`"json"`)
		case "json_schema":
			if rf.JSONSchema == nil || isNull(rf.JSONSchema.Schema) {
				return nil, badRequest("response_format: json_schema needs a schema")
			}
			out.Format = rf.JSONSchema.Schema
		default:
			return nil, badRequest("response_format: unsupported type %q", rf.Type)
		}
	}
	toolNames := make(map[string]string) // tool call id -> function name
	for i, m := range in.Messages {
		om := ollamaMessage{Role: m.Role}
		if m.Role == "" {
			return nil, badRequest("messages[%d]: role is required", i)
		}
		if om.Content, om.Images, err = messageContent(m.Content, i); err != nil {
			return nil, err
		}
		for _, tc := range m.ToolCalls {
			args := json.RawMessage(tc.Function.Arguments)
			if strings.TrimSpace(tc.Function.Arguments) == "" {
				args = json.RawMessage(`{}`)
			} else if !json.Valid(args) {
				return nil, badRequest("messages[%d]: tool call arguments are not JSON", i)
			}
			om.ToolCalls = append(om.ToolCalls, ollamaToolCall{Function: ollamaFunctionCall{Name: tc.Function.Name, Arguments: args}})
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
	return json.Marshal(out)
}

// messageContent flattens OpenAI message content: a string, or an array of
// parts whose text parts are joined by newlines and whose image_url parts,
// which must be base64 data: URLs, become Ollama images.
func messageContent(raw json.RawMessage, i int) (string, []string, error) {
	if isNull(raw) {
		return "", nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil, nil
	}
	var parts []openAIPart
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", nil, badRequest("messages[%d].content: want a string or an array of parts", i)
	}
	var texts, images []string
	for j, p := range parts {
		switch p.Type {
		case "text":
			texts = append(texts, p.Text)
		case "image_url":
			img, err := imageData(p.ImageURL)
			if err != nil {
				return "", nil, badRequest("messages[%d].content[%d]: %s", i, j, err.Message)
			}
			images = append(images, img)
		default:
			return "", nil, badRequest("messages[%d].content[%d]: unsupported part type %q", i, j, p.Type)
		}
	}
	return strings.Join(texts, "\n"), images, nil
}

// imageData returns the base64 payload of an image_url part, which is
// {"url": "data:<type>;base64,<payload>"} or that URL as a bare string.
// Remote URLs are refused: the node fetches nothing on a client's behalf.
func imageData(raw json.RawMessage) (string, *Error) {
	var ref struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		if err := json.Unmarshal(raw, &ref.URL); err != nil {
			return "", badRequest("image_url: want {\"url\": ...}")
		}
	}
	meta, payload, ok := strings.Cut(ref.URL, ",")
	if !ok || !strings.HasPrefix(meta, "data:") || !strings.HasSuffix(meta, ";base64") {
		return "", badRequest("image_url: only base64 data: URLs are supported")
	}
	if payload == "" {
		return "", badRequest("image_url: empty image data")
	}
	return payload, nil
}

// ---- completions ----

type openAICompletionRequest struct {
	sampling
	Prompt   json.RawMessage `json:"prompt"` // string | [string]
	Suffix   string          `json:"suffix"`
	N        *int            `json:"n"`
	BestOf   *int            `json:"best_of"`
	Echo     *bool           `json:"echo"`
	Logprobs json.RawMessage `json:"logprobs"` // integer | null
}

// oneChoice refuses an "n" above 1: Ollama answers one choice per
// request, and answering one when the client asked for several would
// change the answer's meaning.
func oneChoice(n *int) error {
	if n != nil && *n > 1 {
		return badRequest("n: this provider answers one choice per request, got n=%d", *n)
	}
	return nil
}

type ollamaGenerateRequest struct {
	Model   string         `json:"model"`
	Prompt  string         `json:"prompt"`
	Suffix  string         `json:"suffix,omitempty"`
	Stream  bool           `json:"stream"`
	Options *ollamaOptions `json:"options,omitempty"`
}

// completionToOllama translates an OpenAI completions body into an Ollama
// /api/generate body for model, always streaming; "suffix" becomes
// Ollama's suffix. A prompt array must hold exactly one string (one run,
// one answer); echo true, logprobs, and n or best_of above 1 are refused.
// Errors are *Error of kind ErrBadRequest naming the field.
func completionToOllama(body []byte, model string) ([]byte, error) {
	var in openAICompletionRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, badRequest("request body is not a valid completions object")
	}
	prompts, err := stringOrStrings(in.Prompt, "prompt")
	if err != nil {
		return nil, err
	}
	// Fields Ollama's /api/generate cannot honour and whose loss would
	// change the answer: refused, naming the field.
	switch {
	case in.Echo != nil && *in.Echo:
		return nil, badRequest("echo: not supported by this provider")
	case !isNull(in.Logprobs):
		return nil, badRequest("logprobs: not supported by this provider")
	case in.BestOf != nil && *in.BestOf > 1:
		return nil, badRequest("best_of: this provider answers one choice per request, got best_of=%d", *in.BestOf)
	}
	if err := oneChoice(in.N); err != nil {
		return nil, err
	}
	if len(prompts) != 1 {
		return nil, badRequest("prompt: want one string, got %d", len(prompts))
	}
	opts, err := in.options()
	if err != nil {
		return nil, err
	}
	return json.Marshal(ollamaGenerateRequest{Model: model, Prompt: prompts[0], Suffix: in.Suffix, Stream: true, Options: opts})
}

// ---- embeddings ----

type openAIEmbeddingsRequest struct {
	Input      json.RawMessage `json:"input"` // string | []string
	Dimensions *int            `json:"dimensions"`
}

type ollamaEmbedRequest struct {
	Model      string   `json:"model"`
	Input      []string `json:"input"`
	Dimensions *int     `json:"dimensions,omitempty"`
}

// embeddingsToOllama translates an OpenAI embeddings body into an Ollama
// /api/embed body for model; it also returns the number of inputs. Token
// array inputs are refused. Errors are *Error of kind ErrBadRequest.
func embeddingsToOllama(body []byte, model string) ([]byte, int, error) {
	var in openAIEmbeddingsRequest
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, 0, badRequest("request body is not a valid embeddings object")
	}
	inputs, err := stringOrStrings(in.Input, "input")
	if err != nil {
		return nil, 0, err
	}
	if len(inputs) == 0 {
		return nil, 0, badRequest("input: at least one input is required")
	}
	out, err := json.Marshal(ollamaEmbedRequest{Model: model, Input: inputs, Dimensions: in.Dimensions})
	return out, len(inputs), err
}
