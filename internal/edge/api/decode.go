package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"mime"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"iop/internal/translate"
)

// Capabilities a request can need of its provider (Request.Needs).
const (
	needTools  = "tools"
	needVision = "vision"
	// needChoices is a request for more than one choice ("n", or a
	// completion's "best_of", above 1). No provider declares it: the edge
	// finds it in tunnel-path (OpenAI-compatible) providers only, as Ollama
	// and command-line providers answer one choice per request.
	needChoices = "choices"
	// needToolChoice is a request whose tool use only an OpenAI-compatible
	// provider can keep to: tool_choice "required" (or allowed tools of
	// mode "required"), or parallel_tool_calls false. Like needChoices, no
	// provider declares it: tunnel-path providers have it (the request
	// reaches them as sent); Ollama has no such settings.
	needToolChoice = "tool_choice"
	// needRemoteImages is a request with an image given by an http(s)
	// URL: only a provider that fetches it itself (an OpenAI-compatible
	// one, on the tunnel path) can take it; iop fetches nothing for
	// Ollama providers.
	needRemoteImages = "remote_images"
	// needThinking is a request that asks the model to think: Ollama's
	// "think" true or a level, OpenAI's reasoning_effort (or
	// reasoning.effort) other than "none", or reasoning.enabled true. A
	// served model whose server said its capabilities (Ollama's /api/show)
	// has it only when they list "thinking": Ollama refuses think for any
	// other ("does not support thinking"), so such a request goes to a
	// provider whose model thinks.
	needThinking = "thinking"
	// needPromptBatch is a completions request with more than one prompt
	// (an array of strings or of token arrays): one request, several
	// answers. Ollama's /api/generate (and its own /v1/completions) takes
	// one prompt string, so like needChoices only tunnel-path providers
	// have it.
	needPromptBatch = "prompt_batch"
	// needTokenInput is a completions prompt or an embeddings input given
	// as token ids: Ollama takes text only (/api/generate a string,
	// /api/embed a string or strings), so only tunnel-path providers have
	// it.
	needTokenInput = "token_input"
	// needLogprobs is a request for log probabilities (chat's logprobs true
	// or top_logprobs, a completion's logprobs): the translation to
	// Ollama's API returns none, so only tunnel-path providers have it.
	needLogprobs = "logprobs"
)

// maxStopSequences is how many "stop" strings a request may give (OpenAI's
// limit).
const maxStopSequences = 4

var (
	// responseFormatTypes are the "response_format" types a request may ask for.
	responseFormatTypes = []string{"text", "json_object", "json_schema"}
	// contentPartTypes are the message content part types iop accepts, the
	// ones every provider of a chat model reads (decodeContent's cases).
	// Other types (input_audio, file, ...) are rejected here rather than by
	// the provider after a queue wait.
	contentPartTypes = []string{"text", "image_url"}
	// messageRoles are the message roles a request may use: OpenAI's, and
	// the legacy "function" role.
	messageRoles = []string{"system", "user", "assistant", "tool", "developer", "function"}
)

// chatRequest is what the API itself reads from a chat completion request
// body. Everything else in the body travels to the provider untouched.
type chatRequest struct {
	// Model is the requested model name, non-empty.
	Model string
	// Stream is the "stream" flag: answer with SSE chunks.
	Stream bool
	// IncludeUsage is "stream_options.include_usage": end a stream with a
	// usage chunk.
	IncludeUsage bool
	// Needs lists the capabilities the request needs, each once, in the
	// order tools, tool_choice, vision, remote_images, choices.
	Needs []string
	// EstimatedInputTokens is the characters (Unicode code points) of the
	// prompt / 4, rounded up: all message text, the names and arguments of
	// the messages' tool calls, and the JSON (without insignificant space)
	// of each "tools" and legacy "functions" definition.
	EstimatedInputTokens int
	// ollama is the body's translate.ExtensionKey member.
	ollama ollamaMember
}

// jsonTypes names the JSON type each checked field must have, for messages.
const (
	wantString  = "a string"
	wantBool    = "a boolean"
	wantInteger = "an integer"
	wantNumber  = "a number"
	wantArray   = "an array"
	wantObject  = "an object"
)

// decodeChatRequest reads the fields the API needs from an OpenAI chat
// completion request body (OpenAI API reference, "Create chat completion")
// and checks the well-known fields, so a request that every provider would
// reject is answered 400 here, the same on every execution path, instead of
// by the provider after a queue wait.
//
// Keys match exactly (case-sensitive, as providers read them); a duplicated
// key counts by its last occurrence; null counts as absent. Message content
// may be a string, an array of content parts of type "text" or "image_url",
// or null; an "image_url" part makes the request need "vision" (and
// "remote_images" when its URL is http or https), a non-empty "tools" (or
// legacy "functions") array makes it need "tools", tool_choice "required"
// or parallel_tool_calls false with tools "tool_choice", and "n" above 1
// "choices".
//
// Checked values:
//
//	n                        an integer in [1, 128]
//	max_tokens,              an integer in [1, 2147483647]
//	max_completion_tokens
//	seed                     an integer in the int64 range
//	temperature, top_p,      a number that fits a float64
//	presence_penalty,
//	frequency_penalty
//	stop                     a string, or an array of at most 4 strings
//	response_format          an object whose "type" is text, json_object or
//	                         json_schema; for json_schema, "json_schema" is
//	                         required: an object with a string "name" and,
//	                         if given, an object "schema"
//	messages[i].role         one of messageRoles
//	messages[i].name         a string
//	messages[i].tool_calls   an array of objects, each with "type" (if
//	                         given) "function" and a "function" object with
//	                         a string "name" and (if given) string
//	                         "arguments"
//	tool_choice              "none", "auto" or "required", or an object
//	                         with a string "type"; of type "function" it
//	                         names (function.name) one of the tools';
//	                         "required" or a named function needs tools
//	parallel_tool_calls      a boolean
//	reasoning_effort         a string (its values are the provider's to
//	                         check: they differ between servers)
//	reasoning                an object: "effort" a string, "enabled" a
//	                         boolean
//
// An integer must be written as a JSON integer: 1e0 or 1.0 is rejected,
// with a message saying so, although its value is integral. The body is
// forwarded byte for byte, and providers that decode into Go integers
// (Ollama's OpenAI layer, for one) reject such a literal; accepting it here
// would bring back the after-queue 400 this check exists to prevent.
//
// Every error is a *requestError whose param names the field in the form
// "messages[2].content[0].type" ("" when the body as a whole is not a JSON
// object). A client value quoted in its message is clipped (clip).
func decodeChatRequest(body []byte) (chatRequest, error) {
	top, err := decodeObject(body)
	if err != nil {
		return chatRequest{}, err
	}

	var req chatRequest
	if err := decodeField(top, "model", wantString, &req.Model); err != nil {
		return chatRequest{}, err
	}
	if strings.TrimSpace(req.Model) == "" {
		return chatRequest{}, &requestError{param: "model", message: "you must provide a model parameter"}
	}

	chars, images, err := decodeMessages(top["messages"])
	if err != nil {
		return chatRequest{}, err
	}

	if err := decodeField(top, "stream", wantBool, &req.Stream); err != nil {
		return chatRequest{}, err
	}
	var streamOptions map[string]json.RawMessage
	if err := decodeField(top, "stream_options", wantObject, &streamOptions); err != nil {
		return chatRequest{}, err
	}
	if err := decodeNested(streamOptions, "stream_options.include_usage", "include_usage", wantBool, &req.IncludeUsage); err != nil {
		return chatRequest{}, err
	}

	// Fields the API does not use, checked so that a request every provider
	// would reject fails here, before it waits in a queue.
	if err := decodeN(top["n"]); err != nil {
		return chatRequest{}, err
	}
	for _, f := range []struct {
		name     string
		min, max int64
	}{
		{"max_tokens", 1, math.MaxInt32},
		{"max_completion_tokens", 1, math.MaxInt32},
		{"seed", math.MinInt64, math.MaxInt64},
		{"top_logprobs", 0, 20},
	} {
		if err := decodeInteger(top[f.name], f.name, f.min, f.max); err != nil {
			return chatRequest{}, err
		}
	}
	var logprobs bool
	if err := decodeField(top, "logprobs", wantBool, &logprobs); err != nil {
		return chatRequest{}, err
	}
	if logprobs || !isAbsent(top["top_logprobs"]) {
		req.Needs = append(req.Needs, needLogprobs)
	}
	for _, name := range []string{"temperature", "top_p", "presence_penalty", "frequency_penalty"} {
		if err := decodeNumber(top[name], name); err != nil {
			return chatRequest{}, err
		}
	}
	if err := decodeField(top, "user", wantString, new(string)); err != nil {
		return chatRequest{}, err
	}
	if err := decodeStop(top["stop"]); err != nil {
		return chatRequest{}, err
	}
	if err := decodeResponseFormat(top["response_format"]); err != nil {
		return chatRequest{}, err
	}

	var tools, functions []json.RawMessage
	if err := decodeField(top, "tools", wantArray, &tools); err != nil {
		return chatRequest{}, err
	}
	if err := decodeField(top, "functions", wantArray, &functions); err != nil {
		return chatRequest{}, err
	}
	if err := decodeTools(tools, functions); err != nil {
		return chatRequest{}, err
	}
	if len(tools) > 0 || len(functions) > 0 {
		req.Needs = append(req.Needs, needTools)
	}
	constrained, err := decodeToolChoice(top, tools)
	if err != nil {
		return chatRequest{}, err
	}
	if constrained {
		req.Needs = append(req.Needs, needToolChoice)
	}
	thinks, err := decodeReasoning(top)
	if err != nil {
		return chatRequest{}, err
	}
	if thinks {
		req.Needs = append(req.Needs, needThinking)
	}
	for _, def := range slices.Concat(tools, functions) {
		chars += jsonChars(def)
	}
	req.EstimatedInputTokens = (chars + 3) / 4
	if images.vision {
		req.Needs = append(req.Needs, needVision)
	}
	if images.remote {
		req.Needs = append(req.Needs, needRemoteImages)
	}
	if severalChoices(top["n"]) {
		req.Needs = append(req.Needs, needChoices)
	}
	req.ollama = ollamaMemberOf(top)
	return req, nil
}

// imageUse says what images a request's messages carry: any (vision), and
// any given by an http(s) URL (remote).
type imageUse struct{ vision, remote bool }

// decodeMessages checks the "messages" array and returns the number of
// characters of its text and tool calls and what images its content
// parts carry.
func decodeMessages(raw json.RawMessage) (chars int, images imageUse, err error) {
	if isAbsent(raw) {
		return 0, imageUse{}, &requestError{param: "messages", message: "you must provide a messages parameter"}
	}
	var messages []json.RawMessage
	if err := decodeValue(raw, "messages", wantArray, &messages); err != nil {
		return 0, imageUse{}, err
	}
	if len(messages) == 0 {
		return 0, imageUse{}, &requestError{param: "messages", message: "messages must contain at least one message"}
	}
	for i, rawMsg := range messages {
		param := fmt.Sprintf("messages[%d]", i)
		var msg map[string]json.RawMessage
		if err := decodeValue(rawMsg, param, wantObject, &msg); err != nil || msg == nil {
			return 0, imageUse{}, &requestError{param: param, message: "expected an object, got " + jsonKind(rawMsg)}
		}
		var role string
		if err := decodeNested(msg, param+".role", "role", wantString, &role); err != nil {
			return 0, imageUse{}, err
		}
		if role == "" {
			return 0, imageUse{}, &requestError{param: param + ".role", message: "each message must have a role"}
		}
		if !slices.Contains(messageRoles, role) {
			return 0, imageUse{}, &requestError{param: param + ".role", message: fmt.Sprintf("must be one of %s, got %s",
				strings.Join(messageRoles, ", "), strconv.Quote(clip(role)))}
		}
		if err := decodeNested(msg, param+".name", "name", wantString, new(string)); err != nil {
			return 0, imageUse{}, err
		}
		n, err := decodeToolCalls(msg["tool_calls"], param+".tool_calls")
		if err != nil {
			return 0, imageUse{}, err
		}
		chars += n
		n, use, err := decodeContent(msg["content"], param+".content")
		if err != nil {
			return 0, imageUse{}, err
		}
		chars += n
		images.vision = images.vision || use.vision
		images.remote = images.remote || use.remote
	}
	return chars, images, nil
}

// decodeContent checks one message's content: a string, an array of content
// parts, or absent/null. It returns the characters of its text and what
// images its parts carry.
func decodeContent(raw json.RawMessage, param string) (chars int, images imageUse, err error) {
	if isAbsent(raw) {
		return 0, imageUse{}, nil
	}
	switch firstByte(raw) {
	case '"':
		var s string
		if err := decodeValue(raw, param, wantString, &s); err != nil {
			return 0, imageUse{}, err
		}
		return utf8.RuneCountInString(s), imageUse{}, nil
	case '[':
		var parts []json.RawMessage
		if err := decodeValue(raw, param, wantArray, &parts); err != nil {
			return 0, imageUse{}, err
		}
		for j, rawPart := range parts {
			partParam := fmt.Sprintf("%s[%d]", param, j)
			var part map[string]json.RawMessage
			if err := decodeValue(rawPart, partParam, wantObject, &part); err != nil || part == nil {
				return 0, imageUse{}, &requestError{param: partParam, message: "expected an object, got " + jsonKind(rawPart)}
			}
			var typ string
			if err := decodeNested(part, partParam+".type", "type", wantString, &typ); err != nil {
				return 0, imageUse{}, err
			}
			switch typ {
			case "":
				return 0, imageUse{}, &requestError{param: partParam + ".type", message: "each content part must have a type"}
			case "text":
				var text string
				if err := decodeNested(part, partParam+".text", "text", wantString, &text); err != nil {
					return 0, imageUse{}, err
				}
				chars += utf8.RuneCountInString(text)
			case "image_url":
				images.vision = true
				images.remote = images.remote || translate.IsRemoteImageURL(imageURL(part["image_url"]))
			default:
				return 0, imageUse{}, &requestError{param: partParam + ".type",
					message: fmt.Sprintf("content part type %s is not supported; use %s",
						strconv.Quote(clip(typ)), strings.Join(contentPartTypes, " or "))}
			}
		}
		return chars, images, nil
	default:
		return 0, imageUse{}, &requestError{param: param, message: "expected a string or an array of content parts, got " + jsonKind(raw)}
	}
}

// imageURL is the URL of an image_url part's value: {"url": ...} or the
// URL as a bare string; "" for anything else.
func imageURL(raw json.RawMessage) string {
	var ref struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(raw, &ref) != nil {
		_ = json.Unmarshal(raw, &ref.URL)
	}
	return ref.URL
}

// decodeTools checks the shape of a chat request's "tools" and legacy
// "functions" (OpenAI API reference, chat completions "tools"): each tool
// an object of type "function" with a "function" object, or of type
// "custom" with a "custom" object; each function (and custom tool) a
// non-empty string "name", a "description" string if any, "parameters" a
// JSON Schema object if any, "strict" a boolean if any. OpenAI refuses
// the others 400, and iop did not: a malformed tool reached a provider
// that dropped it or failed (a break-it report). A name's characters are
// left to the provider (OpenAI allows [a-zA-Z0-9_-], Ollama any). Errors
// are *requestError naming the field, e.g. "tools[0].function.name".
func decodeTools(tools, functions []json.RawMessage) error {
	checkFunction := func(raw json.RawMessage, param string) error {
		var fn map[string]json.RawMessage
		if err := decodeValue(raw, param, wantObject, &fn); err != nil || fn == nil {
			return &requestError{param: param, message: "expected an object, got " + jsonKind(raw)}
		}
		var name string
		if err := decodeNested(fn, param+".name", "name", wantString, &name); err != nil {
			return err
		}
		if name == "" {
			return &requestError{param: param + ".name", message: "a function must have a name"}
		}
		if err := decodeNested(fn, param+".description", "description", wantString, new(string)); err != nil {
			return err
		}
		var params map[string]json.RawMessage
		if err := decodeNested(fn, param+".parameters", "parameters", wantObject, &params); err != nil {
			return err
		}
		return decodeNested(fn, param+".strict", "strict", wantBool, new(bool))
	}
	for i, raw := range tools {
		param := fmt.Sprintf("tools[%d]", i)
		var tool map[string]json.RawMessage
		if err := decodeValue(raw, param, wantObject, &tool); err != nil || tool == nil {
			return &requestError{param: param, message: "expected an object, got " + jsonKind(raw)}
		}
		var typ string
		if err := decodeNested(tool, param+".type", "type", wantString, &typ); err != nil {
			return err
		}
		switch typ {
		case "function", "custom":
			if isAbsent(tool[typ]) {
				return &requestError{param: param + "." + typ, message: fmt.Sprintf("a tool of type %q must have a %q object", typ, typ)}
			}
			if err := checkFunction(tool[typ], param+"."+typ); err != nil {
				return err
			}
		case "":
			return &requestError{param: param + ".type", message: `each tool must have a type: "function"`}
		default:
			return &requestError{param: param + ".type", message: fmt.Sprintf(`must be "function" or "custom", got %s`, strconv.Quote(clip(typ)))}
		}
	}
	for i, raw := range functions {
		if err := checkFunction(raw, fmt.Sprintf("functions[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// decodeToolChoice checks "tool_choice" and "parallel_tool_calls" (OpenAI
// API reference, "Create chat completion") against the request's tools,
// and reports whether they constrain the tool use beyond what Ollama can
// honour: tool_choice "required" (or allowed tools of mode "required"),
// or parallel_tool_calls false (needToolChoice).
func decodeToolChoice(top map[string]json.RawMessage, tools []json.RawMessage) (constrained bool, err error) {
	var parallel *bool
	if err := decodeField(top, "parallel_tool_calls", wantBool, &parallel); err != nil {
		return false, err
	}
	constrained = parallel != nil && !*parallel && len(tools) > 0
	raw := top["tool_choice"]
	if isAbsent(raw) {
		return constrained, nil
	}
	const choices = `"none", "auto", "required" or an object naming a function`
	switch firstByte(raw) {
	case '"':
		var mode string
		_ = json.Unmarshal(raw, &mode)
		switch mode {
		case "none", "auto":
			return constrained, nil
		case "required":
			if len(tools) == 0 {
				return false, &requestError{param: "tool_choice", message: `"required" needs tools; the request has none`}
			}
			return true, nil
		}
		return false, &requestError{param: "tool_choice", message: fmt.Sprintf("must be %s, got %s", choices, strconv.Quote(clip(mode)))}
	case '{':
	default:
		return false, &requestError{param: "tool_choice", message: fmt.Sprintf("expected %s, got %s", choices, jsonKind(raw))}
	}
	var obj map[string]json.RawMessage
	_ = json.Unmarshal(raw, &obj)
	var typ string
	if err := decodeNested(obj, "tool_choice.type", "type", wantString, &typ); err != nil {
		return false, err
	}
	switch typ {
	case "":
		return false, &requestError{param: "tool_choice.type", message: "a tool_choice object must have a type"}
	case "function":
		var fn map[string]json.RawMessage
		if err := decodeNested(obj, "tool_choice.function", "function", wantObject, &fn); err != nil {
			return false, err
		}
		var name string
		if err := decodeNested(fn, "tool_choice.function.name", "name", wantString, &name); err != nil {
			return false, err
		}
		if name == "" {
			return false, &requestError{param: "tool_choice.function.name", message: "a function tool_choice must name the function"}
		}
		if !slices.Contains(toolNames(tools), name) {
			return false, &requestError{param: "tool_choice.function.name",
				message: fmt.Sprintf("names the function %s, which is not among the request's tools", strconv.Quote(clip(name)))}
		}
	case "allowed_tools":
		var allowed map[string]json.RawMessage
		if err := decodeNested(obj, "tool_choice.allowed_tools", "allowed_tools", wantObject, &allowed); err != nil {
			return false, err
		}
		var mode string
		if err := decodeNested(allowed, "tool_choice.allowed_tools.mode", "mode", wantString, &mode); err != nil {
			return false, err
		}
		if mode == "required" {
			if len(tools) == 0 {
				return false, &requestError{param: "tool_choice.allowed_tools.mode", message: `"required" needs tools; the request has none`}
			}
			constrained = true
		}
	}
	return constrained, nil
}

// toolNames are the function names of a request's tools.
func toolNames(tools []json.RawMessage) []string {
	names := make([]string, 0, len(tools))
	for _, raw := range tools {
		var t struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if json.Unmarshal(raw, &t) == nil && t.Function.Name != "" {
			names = append(names, t.Function.Name)
		}
	}
	return names
}

// decodeReasoning checks the reasoning settings: "reasoning_effort" a
// string, "reasoning" an object whose "effort" is a string and "enabled"
// a boolean. Which efforts a model takes is its provider's to say.
func decodeReasoning(top map[string]json.RawMessage) (thinks bool, err error) {
	var effort, nestedEffort string
	if err := decodeField(top, "reasoning_effort", wantString, &effort); err != nil {
		return false, err
	}
	var reasoning map[string]json.RawMessage
	if err := decodeField(top, "reasoning", wantObject, &reasoning); err != nil {
		return false, err
	}
	if err := decodeNested(reasoning, "reasoning.effort", "effort", wantString, &nestedEffort); err != nil {
		return false, err
	}
	var enabled bool
	if err := decodeNested(reasoning, "reasoning.enabled", "enabled", wantBool, &enabled); err != nil {
		return false, err
	}
	thinks = enabled || (effort != "" && effort != "none") || (nestedEffort != "" && nestedEffort != "none")
	return thinks, nil
}

// decodeToolCalls checks one message's "tool_calls", when present: an array
// of function tool calls. It returns the characters of their function names
// and arguments.
func decodeToolCalls(raw json.RawMessage, param string) (chars int, err error) {
	var calls []json.RawMessage
	if err := decodeValue(raw, param, wantArray, &calls); err != nil {
		return 0, err
	}
	for j, rawCall := range calls {
		callParam := fmt.Sprintf("%s[%d]", param, j)
		var call map[string]json.RawMessage
		if err := decodeValue(rawCall, callParam, wantObject, &call); err != nil || call == nil {
			return 0, &requestError{param: callParam, message: "expected an object, got " + jsonKind(rawCall)}
		}
		var typ string
		if err := decodeNested(call, callParam+".type", "type", wantString, &typ); err != nil {
			return 0, err
		}
		if !isAbsent(call["type"]) && typ != "function" {
			return 0, &requestError{param: callParam + ".type",
				message: "only function tool calls are supported, got " + strconv.Quote(clip(typ))}
		}
		var fn map[string]json.RawMessage
		if err := decodeNested(call, callParam+".function", "function", wantObject, &fn); err != nil {
			return 0, err
		}
		if fn == nil {
			return 0, &requestError{param: callParam + ".function", message: "each tool call must have a function"}
		}
		var name, args string
		if err := decodeNested(fn, callParam+".function.name", "name", wantString, &name); err != nil {
			return 0, err
		}
		if isAbsent(fn["name"]) {
			return 0, &requestError{param: callParam + ".function.name", message: "each tool call function must have a name"}
		}
		if err := decodeNested(fn, callParam+".function.arguments", "arguments", wantString, &args); err != nil {
			return 0, err
		}
		chars += utf8.RuneCountInString(name) + utf8.RuneCountInString(args)
	}
	return chars, nil
}

// jsonChars is the characters of a valid JSON value without insignificant
// space.
func jsonChars(raw json.RawMessage) int {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return utf8.RuneCount(raw)
	}
	return utf8.RuneCount(buf.Bytes())
}

// decodeStop checks "stop": a string, or an array of at most
// maxStopSequences strings.
func decodeStop(raw json.RawMessage) error {
	switch firstByte(raw) {
	case 0, 'n', '"': // absent, null, a string
		return nil
	case '[':
		var seqs []json.RawMessage
		if err := decodeValue(raw, "stop", wantArray, &seqs); err != nil {
			return err
		}
		if len(seqs) > maxStopSequences {
			return &requestError{param: "stop",
				message: fmt.Sprintf("at most %d stop sequences are allowed, got %d", maxStopSequences, len(seqs))}
		}
		for i, seq := range seqs {
			if firstByte(seq) != '"' {
				return &requestError{param: fmt.Sprintf("stop[%d]", i), message: "expected a string, got " + jsonKind(seq)}
			}
		}
		return nil
	default:
		return &requestError{param: "stop",
			message: fmt.Sprintf("expected a string or an array of at most %d strings, got %s", maxStopSequences, jsonKind(raw))}
	}
}

// decodeResponseFormat checks "response_format": an object whose "type" is
// one of responseFormatTypes; for json_schema, "json_schema" must be an
// object with a string "name" and, if given, an object "schema".
func decodeResponseFormat(raw json.RawMessage) error {
	if isAbsent(raw) {
		return nil
	}
	var rf map[string]json.RawMessage
	if err := decodeValue(raw, "response_format", wantObject, &rf); err != nil {
		return err
	}
	var typ string
	if err := decodeNested(rf, "response_format.type", "type", wantString, &typ); err != nil {
		return err
	}
	if typ == "" {
		return &requestError{param: "response_format.type", message: "a response format must have a type"}
	}
	if !slices.Contains(responseFormatTypes, typ) {
		return &requestError{param: "response_format.type", message: fmt.Sprintf("must be one of %s, got %s",
			strings.Join(responseFormatTypes, ", "), strconv.Quote(clip(typ)))}
	}
	if typ != "json_schema" {
		return nil
	}
	var js map[string]json.RawMessage
	if err := decodeNested(rf, "response_format.json_schema", "json_schema", wantObject, &js); err != nil {
		return err
	}
	if js == nil {
		return &requestError{param: "response_format.json_schema", message: "required when the response format type is json_schema"}
	}
	if err := decodeNested(js, "response_format.json_schema.name", "name", wantString, new(string)); err != nil {
		return err
	}
	if isAbsent(js["name"]) {
		return &requestError{param: "response_format.json_schema.name", message: "a json_schema response format must have a name"}
	}
	return decodeNested(js, "response_format.json_schema.schema", "schema", wantObject, new(map[string]json.RawMessage))
}

// maxChoices is the largest "n" (OpenAI's limit).
const maxChoices = 128

// decodeN checks "n", the number of choices: an integer in [1, 128]. A
// provider on the tunnel path answers them all; one on the normalized
// path answers one choice per request and refuses a larger n with a 400
// naming it, rather than silently answering a different question.
func decodeN(raw json.RawMessage) error {
	return decodeInteger(raw, "n", 1, maxChoices)
}

// severalChoices reports whether raw, an "n" or "best_of" that passed its
// check, asks for more than one choice.
func severalChoices(raw json.RawMessage) bool {
	var n int64
	return json.Unmarshal(raw, &n) == nil && n > 1
}

// decodeInteger checks that raw, when present, is a JSON integer in
// [min, max].
func decodeInteger(raw json.RawMessage, param string, min, max int64) error {
	lit, err := numberLiteral(raw, param, wantInteger)
	if lit == "" || err != nil {
		return err
	}
	if v, ok := parseInteger(lit); ok && v >= min && v <= max {
		return nil
	}
	if integralIn(lit, min, max) {
		return notPlainInteger(param, lit)
	}
	return &requestError{param: param, message: fmt.Sprintf("must be an integer between %d and %d, got %s", min, max, clip(lit))}
}

// decodeNumber checks that raw, when present, is a JSON number that fits a
// float64. (One too small to represent is 0, as encoding/json reads it.)
func decodeNumber(raw json.RawMessage, param string) error {
	lit, err := numberLiteral(raw, param, wantNumber)
	if lit == "" || err != nil {
		return err
	}
	if _, err := strconv.ParseFloat(lit, 64); err != nil {
		return &requestError{param: param, message: "number out of range, got " + clip(lit)}
	}
	return nil
}

// numberLiteral returns the JSON number literal raw holds, "" if raw is
// absent or null, or a *requestError if raw is another JSON type. raw must
// be a valid JSON value.
func numberLiteral(raw json.RawMessage, param, want string) (string, error) {
	if isAbsent(raw) {
		return "", nil
	}
	if c := firstByte(raw); c != '-' && (c < '0' || c > '9') {
		return "", &requestError{param: param, message: fmt.Sprintf("expected %s, got %s", want, jsonKind(raw))}
	}
	return string(bytes.TrimSpace(raw)), nil
}

// parseInteger returns the value of a JSON number literal written as an
// integer (no fraction, no exponent) that fits an int64.
func parseInteger(lit string) (int64, bool) {
	if strings.ContainsAny(lit, ".eE") {
		return 0, false
	}
	v, err := strconv.ParseInt(lit, 10, 64)
	return v, err == nil
}

// integralIn reports whether a JSON number literal has an integral value in
// [min, max] (as near as a float64 tells).
func integralIn(lit string, min, max int64) bool {
	f, err := strconv.ParseFloat(lit, 64)
	return err == nil && f == math.Trunc(f) && f >= float64(min) && f < float64(max)+1
}

func notPlainInteger(param, lit string) error {
	return &requestError{param: param, message: "must be an integer written without a fraction or exponent, got " + clip(lit)}
}

// decodeField decodes top[name] into dst, which is left alone when the key
// is absent or null; a value of the wrong JSON type is a *requestError
// naming the field.
func decodeField(top map[string]json.RawMessage, name, want string, dst any) error {
	return decodeNested(top, name, name, want, dst)
}

// decodeNested is decodeField for obj[key] reported as param.
func decodeNested(obj map[string]json.RawMessage, param, key, want string, dst any) error {
	raw, ok := obj[key]
	if !ok {
		return nil
	}
	return decodeValue(raw, param, want, dst)
}

// decodeValue decodes raw into dst; null leaves dst alone.
func decodeValue(raw json.RawMessage, param, want string, dst any) error {
	if isAbsent(raw) {
		return nil
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return &requestError{param: param, message: fmt.Sprintf("expected %s, got %s", want, jsonKind(raw))}
	}
	return nil
}

// isAbsent reports whether a raw value is missing or JSON null.
func isAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || firstByte(raw) == 'n'
}

// firstByte is the first non-space byte of a JSON value, 0 if none.
func firstByte(raw []byte) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

// jsonKind names the JSON type of a valid JSON value, for error messages.
func jsonKind(raw []byte) string {
	switch firstByte(raw) {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	case 0:
		return "nothing"
	default:
		return "a number"
	}
}

// isJSONContentType reports whether a request's Content-Type allows a JSON
// body: absent, application/json, or any type with a "+json" suffix.
func isJSONContentType(header string) bool {
	if header == "" {
		return true
	}
	mediaType, _, err := mime.ParseMediaType(header)
	if err != nil {
		return false
	}
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
