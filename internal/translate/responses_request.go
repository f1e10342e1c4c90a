package translate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// ResponsesRequest is a Responses API create request (POST /v1/responses;
// OpenAI API reference, "Create a model response"), decoded and checked
// by DecodeResponsesRequest. Its Echo fields are what the response object
// repeats of the request; ChatBody turns its items into the canonical
// chat completions body the edge dispatches.
type ResponsesRequest struct {
	// Model is the requested model name, non-empty.
	Model string
	// Stream is "stream": answer with the Responses event stream.
	Stream bool
	// Store is "store" (default true): keep the response for GET,
	// input_items and previous_response_id.
	Store bool
	// Background is "background": run it as a background run.
	Background bool
	// PreviousResponseID is "previous_response_id", "" for none.
	PreviousResponseID string
	// Input is the request's input items in order: a string input is one
	// user message. Item references stay as items of type
	// ItemReference until the caller resolves them.
	Input []ResponseItem
	// Instructions is "instructions" (nil when absent): a system message
	// before every item; not carried to a later response.
	Instructions *string

	// The sampling and output settings, nil when absent.
	MaxOutputTokens   *int64
	Temperature, TopP *float64
	ParallelToolCalls *bool
	// User is "user" ("" when absent), passed on to the provider.
	User string

	// NeedsTools: "tools" has at least one function. NeedsToolChoice:
	// parallel_tool_calls false with tools and no forced call, which only
	// an OpenAI-compatible provider keeps to (an Ollama provider serves a
	// forced call as one call). Thinks: reasoning.effort is set and not
	// "none".
	NeedsTools, NeedsToolChoice, Thinks bool
	// EncryptedReasoning: "include" lists "reasoning.encrypted_content",
	// so the output's reasoning items carry their encrypted_content.
	EncryptedReasoning bool
	// NoThinking: reasoning.effort is "none", so the answer shows no
	// reasoning even if the provider sends some (as Request.NoThinking of
	// an Ollama translation).
	NoThinking bool

	// Echo holds the request's settings as the response object repeats
	// them.
	Echo ResponsesEcho

	// chat settings, in the chat completions API's shape.
	tools           json.RawMessage
	toolChoice      json.RawMessage
	forcesCall      bool // tool_choice forces a call: "required", a function, allowed tools "required"
	responseFormat  json.RawMessage
	reasoningEffort string
}

// ResponsesEcho is what a response object repeats of its request (OpenAI
// API reference, "The response object"), each member as the API writes it
// when the request left it out.
type ResponsesEcho struct {
	Instructions      json.RawMessage   `json:"instructions"`        // a string or null
	MaxOutputTokens   *int64            `json:"max_output_tokens"`   // null when absent
	ParallelToolCalls bool              `json:"parallel_tool_calls"` // default true
	Temperature       *float64          `json:"temperature"`
	TopP              *float64          `json:"top_p"`
	Tools             []json.RawMessage `json:"tools"`       // as sent
	ToolChoice        json.RawMessage   `json:"tool_choice"` // default "auto"
	Text              json.RawMessage   `json:"text"`        // default {"format":{"type":"text"}}
	Reasoning         json.RawMessage   `json:"reasoning"`   // {"effort","summary"}
	Metadata          map[string]string `json:"metadata"`
	User              *string           `json:"user,omitempty"` // a string, left out when absent
	Truncation        string            `json:"truncation"`
}

// builtinTools are the Responses API's hosted tools (OpenAI API
// reference, "Tools"), refused by name: iop's providers run none of them.
var builtinTools = []string{
	"web_search", "web_search_preview", "web_search_preview_2025_03_11", "web_search_2025_08_26",
	"file_search", "computer_use_preview", "computer_use", "code_interpreter", "image_generation",
	"mcp", "local_shell", "shell", "apply_patch", "custom",
}

// Limits of the Responses API's request fields (OpenAI API reference).
const (
	maxMetadataPairs    = 16
	maxMetadataKeyLen   = 64
	maxMetadataValueLen = 512
)

// DecodeResponsesRequest reads and checks a POST /v1/responses body:
//
//	model                  a non-empty string (required)
//	input                  a string, or an array of items: messages
//	                       (role user, system, developer or assistant;
//	                       content a string or input_text, input_image,
//	                       output_text and refusal parts), function_call
//	                       (call_id, name, arguments), function_call_output
//	                       (call_id, output), reasoning (kept in the
//	                       conversation, not sent to the provider) and
//	                       item_reference (id) items
//	instructions           a string
//	tools                  function tools {type:"function", name,
//	                       description, parameters, strict}; any other type
//	                       (web_search, file_search, computer_use_preview,
//	                       code_interpreter, image_generation, mcp, ...) is
//	                       refused naming it
//	tool_choice            "none", "auto", "required", {type:"function",
//	                       name} naming one of the tools, or
//	                       {type:"allowed_tools", mode, tools}
//	parallel_tool_calls,   booleans
//	stream, store,
//	background
//	max_output_tokens      an integer in [1, 2147483647]
//	temperature, top_p     numbers
//	text.format            {type:"text"}, {type:"json_object"} or
//	                       {type:"json_schema", name, schema, strict,
//	                       description}
//	reasoning              {effort, summary}: effort none, minimal, low,
//	                       medium, high or xhigh
//	metadata               at most 16 string pairs (keys ≤ 64, values ≤
//	                       512 characters)
//	user, previous_response_id   strings
//	conversation, prompt   refused: iop serves neither the Conversations
//	                       API nor stored prompts
//
// Other members (include, truncation, service_tier, store options, ...)
// are accepted and ignored. Errors are *FieldError naming the field
// ("input[2].content[0].type"); a background request that does not store
// is refused, as OpenAI refuses it.
func DecodeResponsesRequest(body []byte) (ResponsesRequest, error) {
	top, err := decodeTop(body)
	if err != nil {
		return ResponsesRequest{}, err
	}
	req := ResponsesRequest{Store: true}
	var store *bool
	for _, f := range []struct {
		name string
		dst  any
	}{
		{"model", &req.Model}, {"stream", &req.Stream}, {"store", &store}, {"background", &req.Background},
		{"previous_response_id", &req.PreviousResponseID}, {"instructions", &req.Instructions},
		{"max_output_tokens", &req.MaxOutputTokens}, {"temperature", &req.Temperature}, {"top_p", &req.TopP},
		{"parallel_tool_calls", &req.ParallelToolCalls}, {"user", &req.User},
	} {
		if err := decodeField(top, f.name, f.dst); err != nil {
			return ResponsesRequest{}, err
		}
	}
	if strings.TrimSpace(req.Model) == "" {
		return ResponsesRequest{}, fieldErr("model", "you must provide a model parameter")
	}
	if store != nil {
		req.Store = *store
	}
	if req.Background && !req.Store {
		return ResponsesRequest{}, fieldErr("background", "a background response must be stored: background true needs store true")
	}
	for _, name := range []string{"conversation", "prompt"} {
		if !isNull(top[name]) {
			return ResponsesRequest{}, fieldErr(name, "%q is not supported: iop serves neither the Conversations API nor stored prompts; send the input items (or previous_response_id)", name)
		}
	}
	if m := req.MaxOutputTokens; m != nil && (*m < 1 || *m > math.MaxInt32) {
		return ResponsesRequest{}, fieldErr("max_output_tokens", "must be an integer in [1, %d], got %d", math.MaxInt32, *m)
	}
	// Ranges of the API reference ("Create a model response").
	if v := req.Temperature; v != nil && (*v < 0 || *v > 2) {
		return ResponsesRequest{}, fieldErr("temperature", "must be a number in [0, 2], got %v", *v)
	}
	if v := req.TopP; v != nil && (*v < 0 || *v > 1) {
		return ResponsesRequest{}, fieldErr("top_p", "must be a number in [0, 1], got %v", *v)
	}
	if req.Input, err = decodeInput(top["input"]); err != nil {
		return ResponsesRequest{}, err
	}
	if len(req.Input) == 0 && req.PreviousResponseID == "" {
		return ResponsesRequest{}, fieldErr("input", "you must provide an input parameter")
	}
	var toolNames []string
	if req.tools, toolNames, req.Echo.Tools, err = decodeResponsesTools(top["tools"]); err != nil {
		return ResponsesRequest{}, err
	}
	req.NeedsTools = len(toolNames) > 0
	if err := req.decodeToolChoice(top["tool_choice"], toolNames); err != nil {
		return ResponsesRequest{}, err
	}
	if req.ParallelToolCalls != nil && !*req.ParallelToolCalls && req.NeedsTools && !req.forcesCall {
		req.NeedsToolChoice = true
	}
	if err := req.decodeText(top["text"]); err != nil {
		return ResponsesRequest{}, err
	}
	if err := req.decodeReasoning(top["reasoning"]); err != nil {
		return ResponsesRequest{}, err
	}
	if raw := top["include"]; !isNull(raw) {
		var include []string
		if firstByte(raw) != '[' || json.Unmarshal(raw, &include) != nil {
			return ResponsesRequest{}, fieldErr("include", "must be an array of strings")
		}
		req.EncryptedReasoning = slices.Contains(include, "reasoning.encrypted_content")
	}
	if err := decodeField(top, "metadata", &req.Echo.Metadata); err != nil {
		return ResponsesRequest{}, err
	}
	if err := checkMetadata(req.Echo.Metadata); err != nil {
		return ResponsesRequest{}, err
	}
	req.fillEcho(top)
	return req, nil
}

// fillEcho sets the echoed settings the decoders did not.
func (req *ResponsesRequest) fillEcho(top map[string]json.RawMessage) {
	e := &req.Echo
	e.Instructions = json.RawMessage("null")
	if req.Instructions != nil {
		e.Instructions, _ = json.Marshal(*req.Instructions)
	}
	e.MaxOutputTokens, e.Temperature, e.TopP = req.MaxOutputTokens, req.Temperature, req.TopP
	e.ParallelToolCalls = req.ParallelToolCalls == nil || *req.ParallelToolCalls
	if e.Tools == nil {
		e.Tools = []json.RawMessage{}
	}
	if e.ToolChoice == nil {
		e.ToolChoice = json.RawMessage(`"auto"`)
	}
	if e.Text == nil {
		e.Text = json.RawMessage(`{"format":{"type":"text"}}`)
	}
	if e.Reasoning == nil {
		e.Reasoning = json.RawMessage(`{"effort":null,"summary":null}`)
	}
	if e.Metadata == nil {
		e.Metadata = map[string]string{}
	}
	if req.User != "" {
		e.User = &req.User
	}
	e.Truncation = "disabled"
	var truncation string
	if decodeField(top, "truncation", &truncation) == nil && truncation == "auto" {
		e.Truncation = truncation
	}
}

func checkMetadata(m map[string]string) error {
	if len(m) > maxMetadataPairs {
		return fieldErr("metadata", "at most %d pairs, got %d", maxMetadataPairs, len(m))
	}
	for k, v := range m {
		if utf8.RuneCountInString(k) > maxMetadataKeyLen {
			return fieldErr("metadata", "a key is longer than %d characters", maxMetadataKeyLen)
		}
		if utf8.RuneCountInString(v) > maxMetadataValueLen {
			return fieldErr("metadata."+clip(k), "a value is longer than %d characters", maxMetadataValueLen)
		}
	}
	return nil
}

// decodeInput reads "input": a string (one user message) or an array of
// items.
func decodeInput(raw json.RawMessage) ([]ResponseItem, error) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []ResponseItem{{Type: ItemMessage, Role: "user", Content: []ResponsePart{{Type: PartInputText, Text: s}}}}, nil
	}
	var raws []json.RawMessage
	if firstByte(raw) != '[' || json.Unmarshal(raw, &raws) != nil {
		return nil, fieldErr("input", "must be a string or an array of input items")
	}
	items := make([]ResponseItem, 0, len(raws))
	for i, r := range raws {
		it, err := decodeItem(r, fmt.Sprintf("input[%d]", i))
		if err != nil {
			return nil, err
		}
		if err := checkClientItem(it, fmt.Sprintf("input[%d]", i)); err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

// checkClientItem checks what the chat translation would otherwise refuse
// in its own words (messages[i]...), in the client's: a function_call's arguments that are not JSON text, an
// input_image's data: URL that is not valid base64. Only for the
// client's input: stored items (a provider's own calls among them) are
// read as they were kept.
func checkClientItem(it ResponseItem, param string) error {
	if a := strings.TrimSpace(it.Arguments); it.Type == ItemFunctionCall && a != "" && !json.Valid([]byte(a)) {
		return fieldErr(param+".arguments", "a function_call's arguments must be JSON text (a JSON object, as a string)")
	}
	for j, p := range it.Content {
		if p.Type != PartInputImage {
			continue
		}
		if err := checkDataURL(p.ImageURL); err != nil {
			return fieldErr(fmt.Sprintf("%s.content[%d].image_url", param, j), "%s", err)
		}
	}
	return nil
}

// decodeItem reads one input item (see DecodeResponsesRequest); param
// names it in errors.
func decodeItem(raw json.RawMessage, param string) (ResponseItem, error) {
	if firstByte(raw) != '{' {
		return ResponseItem{}, fieldErr(param, "must be an object")
	}
	var in struct {
		Type      *string         `json:"type"`
		ID        string          `json:"id"`
		Status    string          `json:"status"`
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		CallID    string          `json:"call_id"`
		Name      string          `json:"name"`
		Arguments *string         `json:"arguments"`
		Output    json.RawMessage `json:"output"`
		Summary   json.RawMessage `json:"summary"`
		Encrypted json.RawMessage `json:"encrypted_content"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return ResponseItem{}, typeError(err, param)
	}
	typ := ItemMessage // an "easy input message" has no type
	if in.Type != nil {
		typ = *in.Type
	}
	it := ResponseItem{Type: typ, ID: in.ID, Status: in.Status}
	switch typ {
	case ItemMessage:
		switch in.Role {
		case "user", "system", "developer", "assistant":
		case "":
			return ResponseItem{}, fieldErr(param+".role", "a message needs a role")
		default:
			return ResponseItem{}, fieldErr(param+".role", `must be "user", "system", "developer" or "assistant", got %q`, clip(in.Role))
		}
		it.Role = in.Role
		parts, err := decodeParts(in.Content, param+".content", in.Role == "assistant")
		if err != nil {
			return ResponseItem{}, err
		}
		it.Content = parts
	case ItemFunctionCall:
		if in.CallID == "" {
			return ResponseItem{}, fieldErr(param+".call_id", "a function_call needs a call_id")
		}
		if in.Name == "" {
			return ResponseItem{}, fieldErr(param+".name", "a function_call needs a name")
		}
		it.CallID, it.Name = in.CallID, in.Name
		if in.Arguments != nil {
			it.Arguments = *in.Arguments
		}

	case ItemFunctionCallOutput:
		if in.CallID == "" {
			return ResponseItem{}, fieldErr(param+".call_id", "a function_call_output needs a call_id")
		}
		it.CallID = in.CallID
		if err := checkToolOutput(in.Output, param+".output"); err != nil {
			return ResponseItem{}, err
		}
		it.Output = append(json.RawMessage(nil), bytes.TrimSpace(in.Output)...)
	case ItemReasoning:
		var err error
		if it.Summary, err = decodeReasoningParts(in.Summary, param+".summary", PartSummaryText); err != nil {
			return ResponseItem{}, err
		}
		if it.Content, err = decodeReasoningParts(in.Content, param+".content", PartReasoningText); err != nil {
			return ResponseItem{}, err
		}
		if !isNull(in.Encrypted) && json.Unmarshal(in.Encrypted, &it.EncryptedContent) != nil {
			return ResponseItem{}, fieldErr(param+".encrypted_content", "must be a string")
		}
	case ItemReference:
		if in.ID == "" {
			return ResponseItem{}, fieldErr(param+".id", "an item_reference needs an id")
		}
	default:
		return ResponseItem{}, fieldErr(param+".type", "input items of type %q are not supported: iop serves messages, function calls and their outputs, reasoning and item references", clip(typ))
	}
	return it, nil
}

// decodeParts reads a message's content: a string (one input_text part,
// output_text for an assistant) or an array of parts.
func decodeParts(raw json.RawMessage, param string, assistant bool) ([]ResponsePart, error) {
	if isNull(raw) {
		return nil, fieldErr(param, "a message needs content")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		typ := PartInputText
		if assistant {
			typ = PartOutputText
		}
		return []ResponsePart{{Type: typ, Text: s}}, nil
	}
	var raws []json.RawMessage
	if firstByte(raw) != '[' || json.Unmarshal(raw, &raws) != nil {
		return nil, fieldErr(param, "must be a string or an array of content parts")
	}
	parts := make([]ResponsePart, 0, len(raws))
	for j, r := range raws {
		p, err := decodePart(r, fmt.Sprintf("%s[%d]", param, j))
		if err != nil {
			return nil, err
		}
		parts = append(parts, p)
	}
	return parts, nil
}

func decodePart(raw json.RawMessage, param string) (ResponsePart, error) {
	var in struct {
		Type     string  `json:"type"`
		Text     *string `json:"text"`
		ImageURL *string `json:"image_url"`
		FileID   *string `json:"file_id"`
		Detail   string  `json:"detail"`
		Refusal  *string `json:"refusal"`
	}
	if firstByte(raw) != '{' {
		return ResponsePart{}, fieldErr(param, "must be an object")
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return ResponsePart{}, typeError(err, param)
	}
	p := ResponsePart{Type: in.Type}
	switch in.Type {
	case PartInputText, PartOutputText:
		if in.Text == nil {
			return ResponsePart{}, fieldErr(param+".text", "a %s part needs text", in.Type)
		}
		p.Text = *in.Text
	case PartRefusal:
		if in.Refusal != nil {
			p.Refusal = *in.Refusal
		}
	case PartInputImage:
		switch {
		case in.FileID != nil && *in.FileID != "":
			return ResponsePart{}, fieldErr(param+".file_id", "images given by file_id are not supported (iop has no Files API); send image_url, a data: URL or an http(s) URL")
		case in.ImageURL == nil || *in.ImageURL == "":
			return ResponsePart{}, fieldErr(param+".image_url", "an input_image part needs an image_url")
		}
		switch in.Detail {
		case "", "auto", "low", "high":
		default:
			return ResponsePart{}, fieldErr(param+".detail", `must be "auto", "low" or "high", got %q`, clip(in.Detail))
		}
		p.ImageURL, p.Detail = *in.ImageURL, in.Detail
	case "":
		return ResponsePart{}, fieldErr(param+".type", "a content part needs a type")
	default:
		return ResponsePart{}, fieldErr(param+".type", "content parts of type %q are not supported: iop takes input_text, input_image, output_text and refusal", clip(in.Type))
	}
	return p, nil
}

// decodeReasoningParts reads a reasoning item's summary or content: an
// array of parts of type want.
func decodeReasoningParts(raw json.RawMessage, param, want string) ([]ResponsePart, error) {
	if isNull(raw) {
		return nil, nil
	}
	var in []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, typeError(err, param)
	}
	parts := make([]ResponsePart, 0, len(in))
	for j, p := range in {
		if p.Type != want {
			return nil, fieldErr(fmt.Sprintf("%s[%d].type", param, j), "must be %q, got %q", want, clip(p.Type))
		}
		parts = append(parts, ResponsePart{Type: want, Text: p.Text})
	}
	return parts, nil
}

// checkToolOutput checks a function_call_output's output: a string, or
// an array of input_text and input_image parts.
func checkToolOutput(raw json.RawMessage, param string) error {
	if isNull(raw) {
		return fieldErr(param, "a function_call_output needs an output")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return nil
	}
	var raws []json.RawMessage
	if firstByte(raw) != '[' || json.Unmarshal(raw, &raws) != nil {
		return fieldErr(param, "must be a string or an array of content parts")
	}
	for j, r := range raws {
		p, err := decodePart(r, fmt.Sprintf("%s[%d]", param, j))
		if err != nil {
			return err
		}
		if p.Type != PartInputText && p.Type != PartInputImage {
			return fieldErr(fmt.Sprintf("%s[%d].type", param, j), "must be input_text or input_image, got %q", p.Type)
		}
	}
	return nil
}

// checkDataURL checks an input_image's data: URL, in the client's words
// (the chat translation would name its own messages[i]...image_url): a
// base64 one ("data:<type>;base64,<payload>") whose payload is standard
// base64 and not empty. Other URLs are not its business.
func checkDataURL(url string) error {
	if len(url) < 5 || !strings.EqualFold(url[:5], "data:") {
		return nil
	}
	meta, payload, ok := strings.Cut(url, ",")
	if !ok || !strings.HasSuffix(meta, ";base64") {
		return errors.New(`only base64 data URLs are supported, "data:image/png;base64,..."`)
	}
	if payload == "" {
		return errors.New("empty image data")
	}
	if _, err := io.Copy(io.Discard, base64.NewDecoder(base64.StdEncoding, strings.NewReader(payload))); err != nil {
		return fmt.Errorf("image data is not valid base64: %v", err)
	}
	return nil
}

// decodeResponsesTools reads "tools": function tools only. It returns
// them in the chat completions shape, their names, and each as sent (for
// the response object).
func decodeResponsesTools(raw json.RawMessage) (chat json.RawMessage, names []string, echo []json.RawMessage, err error) {
	if isNull(raw) {
		return nil, nil, nil, nil
	}
	var raws []json.RawMessage
	if firstByte(raw) != '[' || json.Unmarshal(raw, &raws) != nil {
		return nil, nil, nil, fieldErr("tools", "must be an array of tools")
	}
	type function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
		Strict      *bool           `json:"strict,omitempty"`
	}
	type chatTool struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	var out []chatTool
	for i, r := range raws {
		param := fmt.Sprintf("tools[%d]", i)
		var t struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
			Strict      *bool           `json:"strict"`
		}
		if firstByte(r) != '{' {
			return nil, nil, nil, fieldErr(param, "must be an object")
		}
		if err := json.Unmarshal(r, &t); err != nil {
			return nil, nil, nil, typeError(err, param)
		}
		switch {
		case t.Type == "function":
		case t.Type == "":
			return nil, nil, nil, fieldErr(param+".type", "a tool needs a type")
		case slices.Contains(builtinTools, t.Type) || strings.HasPrefix(t.Type, "web_search"):
			return nil, nil, nil, fieldErr(param+".type", "the built-in tool %q is not supported: iop's providers run function tools only", clip(t.Type))
		default:
			return nil, nil, nil, fieldErr(param+".type", "tools of type %q are not supported: iop's providers run function tools only", clip(t.Type))
		}
		if strings.TrimSpace(t.Name) == "" {
			return nil, nil, nil, fieldErr(param+".name", "a function tool needs a name")
		}
		if slices.Contains(names, t.Name) {
			return nil, nil, nil, fieldErr(param+".name", "duplicate tool name %q: each function tool needs its own name", clip(t.Name))
		}
		if !isNull(t.Parameters) && firstByte(t.Parameters) != '{' {
			return nil, nil, nil, fieldErr(param+".parameters", "must be a JSON Schema object")
		}
		if isNull(t.Parameters) {
			t.Parameters = nil
		}
		out = append(out, chatTool{Type: "function", Function: function{t.Name, t.Description, t.Parameters, t.Strict}})
		names = append(names, t.Name)
		echo = append(echo, echoFunctionTool(r))
	}
	if len(out) == 0 {
		return nil, nil, []json.RawMessage{}, nil
	}
	chat, err = json.Marshal(out)
	return chat, names, echo, err
}

// compactJSON is raw without insignificant space (raw itself if it cannot
// be compacted).
// echoFunctionTool is a function tool as the response object repeats it:
// as sent, with the members OpenAI's FunctionTool always has (OpenAPI
// document, components.schemas.FunctionTool: name, parameters, strict,
// type) null when the request left them out. strict is not made true:
// iop constrains no answer to the schema by itself, the provider gets
// strict as the client sent it.
func echoFunctionTool(raw json.RawMessage) json.RawMessage {
	var members map[string]json.RawMessage
	if json.Unmarshal(raw, &members) != nil {
		return compactJSON(raw)
	}
	for _, m := range []string{"parameters", "strict"} {
		if _, ok := members[m]; !ok {
			members[m] = json.RawMessage("null")
		}
	}
	out, err := json.Marshal(members)
	if err != nil {
		return compactJSON(raw)
	}
	return out
}

func compactJSON(raw json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}

// decodeToolChoice reads "tool_choice" into the chat API's shape.
func (req *ResponsesRequest) decodeToolChoice(raw json.RawMessage, names []string) error {
	if isNull(raw) {
		return nil
	}
	req.Echo.ToolChoice = compactJSON(raw)
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto", "none":
		case "required":
			if len(names) == 0 {
				return fieldErr("tool_choice", `"required" needs tools`)
			}
			req.forcesCall = true
		default:
			return fieldErr("tool_choice", `must be "none", "auto", "required" or an object, got %q`, clip(mode))
		}
		req.toolChoice, _ = json.Marshal(mode)
		return nil
	}
	var obj struct {
		Type  string `json:"type"`
		Name  string `json:"name"`
		Mode  string `json:"mode"`
		Tools []struct {
			Type string `json:"type"`
			Name string `json:"name"`
		} `json:"tools"`
	}
	if firstByte(raw) != '{' || json.Unmarshal(raw, &obj) != nil {
		return fieldErr("tool_choice", `must be "none", "auto", "required" or an object`)
	}
	type fn struct {
		Name string `json:"name"`
	}
	type named struct {
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	switch obj.Type {
	case "function":
		if !slices.Contains(names, obj.Name) {
			return fieldErr("tool_choice.name", "names the function %q, which is not among the request's tools", clip(obj.Name))
		}
		req.toolChoice, _ = json.Marshal(named{"function", fn{obj.Name}})
		req.forcesCall = true
	case "allowed_tools":
		switch obj.Mode {
		case "auto":
		case "required":
			req.forcesCall = true
		default:
			return fieldErr("tool_choice.mode", `must be "auto" or "required", got %q`, clip(obj.Mode))
		}
		allowed := make([]named, 0, len(obj.Tools))
		for j, t := range obj.Tools {
			if t.Type != "function" || !slices.Contains(names, t.Name) {
				return fieldErr(fmt.Sprintf("tool_choice.tools[%d]", j), "must name one of the request's function tools")
			}
			allowed = append(allowed, named{"function", fn{t.Name}})
		}
		req.toolChoice, _ = json.Marshal(map[string]any{"type": "allowed_tools",
			"allowed_tools": map[string]any{"mode": obj.Mode, "tools": allowed}})
	default:
		return fieldErr("tool_choice.type", "a tool_choice of type %q is not supported: iop's providers run function tools only", clip(obj.Type))
	}
	return nil
}

// decodeText reads "text": its format becomes the chat API's
// response_format.
func (req *ResponsesRequest) decodeText(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var text struct {
		Format json.RawMessage `json:"format"`
	}
	if firstByte(raw) != '{' || json.Unmarshal(raw, &text) != nil {
		return fieldErr("text", "must be an object")
	}
	req.Echo.Text = compactJSON(raw)
	if isNull(text.Format) {
		return nil
	}
	var f struct {
		Type        string          `json:"type"`
		Name        *string         `json:"name"`
		Schema      json.RawMessage `json:"schema"`
		Strict      *bool           `json:"strict"`
		Description string          `json:"description"`
	}
	if firstByte(text.Format) != '{' {
		return fieldErr("text.format", "must be an object")
	}
	if err := json.Unmarshal(text.Format, &f); err != nil {
		return typeError(err, "text.format")
	}
	switch f.Type {
	case "text":
	case "json_object":
		req.responseFormat = json.RawMessage(`{"type":"json_object"}`)
	case "json_schema":
		if f.Name == nil || *f.Name == "" {
			return fieldErr("text.format.name", "a json_schema format needs a name")
		}
		if firstByte(f.Schema) != '{' {
			return fieldErr("text.format.schema", "a json_schema format needs a schema object")
		}
		schema := struct {
			Name        string          `json:"name"`
			Description string          `json:"description,omitempty"`
			Schema      json.RawMessage `json:"schema"`
			Strict      *bool           `json:"strict,omitempty"`
		}{*f.Name, f.Description, f.Schema, f.Strict}
		var err error
		if req.responseFormat, err = json.Marshal(map[string]any{"type": "json_schema", "json_schema": schema}); err != nil {
			return fieldErr("text.format.schema", "invalid schema")
		}
	default:
		return fieldErr("text.format.type", `must be "text", "json_object" or "json_schema", got %q`, clip(f.Type))
	}
	return nil
}

// decodeReasoning reads "reasoning": {effort, summary}.
func (req *ResponsesRequest) decodeReasoning(raw json.RawMessage) error {
	if isNull(raw) {
		return nil
	}
	var r struct {
		Effort  *string `json:"effort"`
		Summary *string `json:"summary"`
	}
	if firstByte(raw) != '{' {
		return fieldErr("reasoning", "must be an object")
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return typeError(err, "reasoning")
	}
	if r.Effort != nil {
		switch *r.Effort {
		case "none", "minimal", "low", "medium", "high", "xhigh":
		default:
			return fieldErr("reasoning.effort", `must be one of "none", "minimal", "low", "medium", "high", "xhigh", got %q`, clip(*r.Effort))
		}
		req.reasoningEffort = *r.Effort
		req.Thinks, req.NoThinking = *r.Effort != "none", *r.Effort == "none"
	}
	if r.Summary != nil {
		switch *r.Summary {
		case "auto", "concise", "detailed":
		default:
			return fieldErr("reasoning.summary", `must be "auto", "concise" or "detailed", got %q`, clip(*r.Summary))
		}
	}
	req.Echo.Reasoning, _ = json.Marshal(r)
	return nil
}

// ResponsesChat is the canonical chat completions body of a Responses
// request, and what the edge needs to know of it.
type ResponsesChat struct {
	// Body always streams, with usage (as Request.Body of an Ollama
	// translation).
	Body []byte
	// Chars is the characters (Unicode code points) of the prompt: every
	// message's text, the names and arguments of tool calls, tool outputs,
	// and the JSON of the tool definitions.
	Chars int
	// Vision: an image is among the items; RemoteImages: one given by an
	// http(s) URL.
	Vision, RemoteImages bool
}

// chatMessage is a message of the canonical chat body.
type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"` // string, []chatPart or nil
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatPart struct {
	Type     string        `json:"type"`
	Text     string        `json:"text,omitempty"`
	ImageURL *chatImageURL `json:"image_url,omitempty"`
}

type chatImageURL struct {
	URL    string `json:"url"`
	Detail string `json:"detail,omitempty"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// ChatBody translates the conversation, items (the earlier responses'
// items, then this request's input, references resolved), into the
// canonical chat completions body for model:
//
//	instructions             a first system message
//	message (user, system,   a message of that role (developer as system);
//	developer)               input_text parts become text (a string for a
//	                         single text part), input_image parts image_url
//	                         parts
//	message (assistant)      an assistant message with the output_text
//	                         parts' text (refusals as text)
//	function_call            a tool_calls entry of the assistant message
//	                         it follows (a new one if it follows none);
//	                         arguments that are not JSON (a stored call a
//	                         provider made so) as a JSON string
//	function_call_output     a tool message with tool_call_id; an array
//	                         output's text parts joined
//	reasoning                left out (no provider takes it back)
//	max_output_tokens        max_tokens
//	text.format              response_format
//	reasoning.effort         reasoning_effort
//	tools, tool_choice,      their chat completions shape
//	parallel_tool_calls,
//	temperature, top_p, user
//
// Errors are *FieldError: an item reference left unresolved, or no
// message at all.
func (req *ResponsesRequest) ChatBody(model string, items []ResponseItem) (ResponsesChat, error) {
	var out ResponsesChat
	var msgs []chatMessage
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: *req.Instructions})
		out.Chars += utf8.RuneCountInString(*req.Instructions)
	}
	for _, it := range items {
		switch it.Type {
		case ItemMessage:
			role := it.Role
			if role == "developer" {
				role = "system"
			}
			if role == "assistant" {
				var text strings.Builder
				for _, p := range it.Content {
					text.WriteString(p.Text)
					text.WriteString(p.Refusal)
				}
				out.Chars += utf8.RuneCountInString(text.String())
				msgs = append(msgs, chatMessage{Role: role, Content: text.String()})
				continue
			}
			content, chars, vision, remote := chatContent(it.Content)
			out.Chars += chars
			out.Vision = out.Vision || vision
			out.RemoteImages = out.RemoteImages || remote
			msgs = append(msgs, chatMessage{Role: role, Content: content})
		case ItemFunctionCall:
			var tc chatToolCall
			tc.ID, tc.Type = it.CallID, "function"
			tc.Function.Name, tc.Function.Arguments = it.Name, it.Arguments
			if strings.TrimSpace(tc.Function.Arguments) == "" {
				tc.Function.Arguments = "{}"
			} else if !json.Valid([]byte(tc.Function.Arguments)) {
				// A stored call a provider made with arguments that are
				// not JSON (a client's own are refused at decode): sent
				// as a JSON string, so that a provider that takes the
				// arguments as JSON (Ollama) still gets them.
				quoted, _ := json.Marshal(tc.Function.Arguments)
				tc.Function.Arguments = string(quoted)
			}
			out.Chars += utf8.RuneCountInString(it.Name) + utf8.RuneCountInString(it.Arguments)
			if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
				msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, tc)
				if s, ok := msgs[n-1].Content.(string); ok && s == "" {
					msgs[n-1].Content = nil
				}
				continue
			}
			msgs = append(msgs, chatMessage{Role: "assistant", ToolCalls: []chatToolCall{tc}})
		case ItemFunctionCallOutput:
			text := toolOutputText(it.Output)
			out.Chars += utf8.RuneCountInString(text)
			msgs = append(msgs, chatMessage{Role: "tool", Content: text, ToolCallID: it.CallID})
		case ItemReasoning:
		case ItemReference:
			return ResponsesChat{}, fieldErr("input", "the item_reference %q names no stored item", clip(it.ID))
		}
	}
	if len(msgs) == 0 {
		return ResponsesChat{}, fieldErr("input", "you must provide an input parameter")
	}
	out.Chars += jsonChars(req.tools)
	body := struct {
		Model             string          `json:"model"`
		Messages          []chatMessage   `json:"messages"`
		Stream            bool            `json:"stream"`
		StreamOptions     map[string]bool `json:"stream_options"`
		MaxTokens         *int64          `json:"max_tokens,omitempty"`
		Temperature       *float64        `json:"temperature,omitempty"`
		TopP              *float64        `json:"top_p,omitempty"`
		ResponseFormat    json.RawMessage `json:"response_format,omitempty"`
		ReasoningEffort   string          `json:"reasoning_effort,omitempty"`
		Tools             json.RawMessage `json:"tools,omitempty"`
		ToolChoice        json.RawMessage `json:"tool_choice,omitempty"`
		ParallelToolCalls *bool           `json:"parallel_tool_calls,omitempty"`
		User              string          `json:"user,omitempty"`
	}{
		Model: model, Messages: msgs, Stream: true, StreamOptions: map[string]bool{"include_usage": true},
		MaxTokens: req.MaxOutputTokens, Temperature: req.Temperature, TopP: req.TopP,
		ResponseFormat: req.responseFormat, ReasoningEffort: req.reasoningEffort, User: req.User,
	}
	if len(req.tools) > 0 {
		body.Tools, body.ToolChoice, body.ParallelToolCalls = req.tools, req.toolChoice, req.ParallelToolCalls
	}
	var err error
	out.Body, err = json.Marshal(body)
	return out, err
}

// chatContent is a user, system or developer message's content in the
// chat API's shape: a string for a single text part, else parts.
func chatContent(parts []ResponsePart) (content any, chars int, vision, remote bool) {
	if len(parts) == 1 && parts[0].Type == PartInputText {
		return parts[0].Text, utf8.RuneCountInString(parts[0].Text), false, false
	}
	out := make([]chatPart, 0, len(parts))
	for _, p := range parts {
		switch p.Type {
		case PartInputImage:
			vision = true
			remote = remote || IsRemoteImageURL(p.ImageURL)
			out = append(out, chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: p.ImageURL, Detail: p.Detail}})
		default:
			text := p.Text + p.Refusal
			chars += utf8.RuneCountInString(text)
			out = append(out, chatPart{Type: "text", Text: text})
		}
	}
	return out, chars, vision, remote
}

// toolOutputText is a function_call_output's output as text: the string,
// or an array's text parts joined by newlines.
func toolOutputText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var texts []string
	for _, p := range parts {
		if p.Type == PartInputText {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n")
}

// jsonChars is the characters of raw's JSON without insignificant space.
func jsonChars(raw json.RawMessage) int {
	if len(raw) == 0 {
		return 0
	}
	return utf8.RuneCount(compactJSON(raw))
}
