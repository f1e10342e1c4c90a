package request

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"iop/internal/jsonvalue"
	"iop/internal/translate"
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
// legacy "functions") array makes it need "tools", parallel_tool_calls
// false with tools and no forced call "tool_choice", and "n" above 1
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
// Every error is a *FieldError whose param names the field in the form
// "messages[2].content[0].type" ("" when the body as a whole is not a JSON
// object). A client value quoted in its message is clipped (clip).
func decodeChatRequest(body []byte) (chatRequest, error) {
	top, err := parseBody(body)
	if err != nil {
		return chatRequest{}, err
	}
	return chatRequestOf(top)
}

// chatRequestOf is decodeChatRequest of a parsed body.
func chatRequestOf(top *jsonvalue.Value) (chatRequest, error) {
	var req chatRequest
	var err error
	if req.Model, err = stringOf(top.Get("model"), "model"); err != nil {
		return chatRequest{}, err
	}
	if strings.TrimSpace(req.Model) == "" {
		return chatRequest{}, &FieldError{Field: "model", Message: "you must provide a model parameter"}
	}

	chars, images, err := messagesOf(top.Get("messages"))
	if err != nil {
		return chatRequest{}, err
	}

	if req.Stream, err = boolOf(top.Get("stream"), "stream"); err != nil {
		return chatRequest{}, err
	}
	if req.IncludeUsage, err = includeUsageOf(top); err != nil {
		return chatRequest{}, err
	}

	// Fields the API does not use, checked so that a request every provider
	// would reject fails here, before it waits in a queue.
	if err := checkInteger(top.Get("n"), "n", 1, maxChoices); err != nil {
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
		if err := checkInteger(top.Get(f.name), f.name, f.min, f.max); err != nil {
			return chatRequest{}, err
		}
	}
	logprobs, err := boolOf(top.Get("logprobs"), "logprobs")
	if err != nil {
		return chatRequest{}, err
	}
	if logprobs || !top.Get("top_logprobs").Absent() {
		req.Needs = append(req.Needs, NeedLogprobs)
	}
	for _, name := range []string{"temperature", "top_p", "presence_penalty", "frequency_penalty"} {
		if err := checkNumber(top.Get(name), name); err != nil {
			return chatRequest{}, err
		}
	}
	if err := checkType(top.Get("user"), "user", WantString); err != nil {
		return chatRequest{}, err
	}
	if err := checkStop(top.Get("stop")); err != nil {
		return chatRequest{}, err
	}
	if err := checkResponseFormat(top.Get("response_format")); err != nil {
		return chatRequest{}, err
	}

	tools, functions := top.Get("tools"), top.Get("functions")
	if err := checkType(tools, "tools", WantArray); err != nil {
		return chatRequest{}, err
	}
	if err := checkType(functions, "functions", WantArray); err != nil {
		return chatRequest{}, err
	}
	if err := checkTools(elemsOf(tools), elemsOf(functions)); err != nil {
		return chatRequest{}, err
	}
	if len(elemsOf(tools)) > 0 || len(elemsOf(functions)) > 0 {
		req.Needs = append(req.Needs, NeedTools)
	}
	constrained, err := toolChoiceOf(top, elemsOf(tools))
	if err != nil {
		return chatRequest{}, err
	}
	if constrained {
		req.Needs = append(req.Needs, NeedToolChoice)
	}
	thinks, err := reasoningOf(top)
	if err != nil {
		return chatRequest{}, err
	}
	if thinks {
		req.Needs = append(req.Needs, NeedThinking)
	}
	for _, def := range elemsOf(tools) {
		chars += def.Compact
	}
	for _, def := range elemsOf(functions) {
		chars += def.Compact
	}
	req.EstimatedInputTokens = (chars + 3) / 4
	if images.vision {
		req.Needs = append(req.Needs, NeedVision)
	}
	if images.remote {
		req.Needs = append(req.Needs, NeedRemoteImages)
	}
	if severalChoicesOf(top.Get("n")) {
		req.Needs = append(req.Needs, NeedChoices)
	}
	req.ollama = ollamaMemberOf(top)
	return req, nil
}

// imageUse says what images a request's messages carry: any (vision), and
// any given by an http(s) URL (remote).
type imageUse struct{ vision, remote bool }

// messagesOf checks the "messages" array and returns the number of
// characters of its text and tool calls and what images its content
// parts carry.
func messagesOf(v *jsonvalue.Value) (chars int, images imageUse, err error) {
	if v.Absent() {
		return 0, imageUse{}, &FieldError{Field: "messages", Message: "you must provide a messages parameter"}
	}
	if err := checkType(v, "messages", WantArray); err != nil {
		return 0, imageUse{}, err
	}
	if len(v.Elems) == 0 {
		return 0, imageUse{}, &FieldError{Field: "messages", Message: "messages must contain at least one message"}
	}
	for i := range v.Elems {
		msg := &v.Elems[i]
		param := fmt.Sprintf("messages[%d]", i)
		if msg.Kind() != '{' {
			return 0, imageUse{}, &FieldError{Field: param, Message: "expected an object, got " + msg.TypeName()}
		}
		role, err := stringOf(msg.Get("role"), param+".role")
		if err != nil {
			return 0, imageUse{}, err
		}
		if role == "" {
			return 0, imageUse{}, &FieldError{Field: param + ".role", Message: "each message must have a role"}
		}
		if !slices.Contains(messageRoles, role) {
			return 0, imageUse{}, &FieldError{Field: param + ".role", Message: fmt.Sprintf("must be one of %s, got %s",
				strings.Join(messageRoles, ", "), strconv.Quote(Clip(role)))}
		}
		if err := checkType(msg.Get("name"), param+".name", WantString); err != nil {
			return 0, imageUse{}, err
		}
		n, err := toolCallsOf(msg.Get("tool_calls"), param+".tool_calls")
		if err != nil {
			return 0, imageUse{}, err
		}
		chars += n
		n, use, err := contentOf(msg.Get("content"), param+".content")
		if err != nil {
			return 0, imageUse{}, err
		}
		chars += n
		images.vision = images.vision || use.vision
		images.remote = images.remote || use.remote
	}
	return chars, images, nil
}

// contentOf checks one message's content: a string, an array of content
// parts, or absent/null. It returns the characters of its text and what
// images its parts carry.
func contentOf(v *jsonvalue.Value, param string) (chars int, images imageUse, err error) {
	if v.Absent() {
		return 0, imageUse{}, nil
	}
	switch v.Kind() {
	case '"':
		return v.Runes, imageUse{}, nil
	case '[':
		for j := range v.Elems {
			part := &v.Elems[j]
			partParam := fmt.Sprintf("%s[%d]", param, j)
			if part.Kind() != '{' {
				return 0, imageUse{}, &FieldError{Field: partParam, Message: "expected an object, got " + part.TypeName()}
			}
			typ, err := stringOf(part.Get("type"), partParam+".type")
			if err != nil {
				return 0, imageUse{}, err
			}
			switch typ {
			case "":
				return 0, imageUse{}, &FieldError{Field: partParam + ".type", Message: "each content part must have a type"}
			case "text":
				text := part.Get("text")
				if err := checkType(text, partParam+".text", WantString); err != nil {
					return 0, imageUse{}, err
				}
				if !text.Absent() {
					chars += text.Runes
				}
			case "image_url":
				images.vision = true
				images.remote = images.remote || translate.IsRemoteImageURL(imageURLOf(part.Get("image_url")))
			default:
				return 0, imageUse{}, &FieldError{Field: partParam + ".type",
					Message: fmt.Sprintf("content part type %s is not supported; use %s",
						strconv.Quote(Clip(typ)), strings.Join(contentPartTypes, " or "))}
			}
		}
		return chars, images, nil
	default:
		return 0, imageUse{}, &FieldError{Field: param, Message: "expected a string or an array of content parts, got " + v.TypeName()}
	}
}

// imageURLOf is the URL of an image_url part's value: {"url": ...} or the
// URL as a bare string; "" for anything else. As encoding/json decodes
// such a value into struct{URL string `json:"url"`}, a key "url" matches
// in any case, and the last string one counts.
func imageURLOf(v *jsonvalue.Value) string {
	switch v.Kind() {
	case '"':
		return v.Text()
	case '{':
		url := ""
		for i := range v.Members {
			m := &v.Members[i]
			if strings.EqualFold(m.Key(), "url") && m.Value.Kind() == '"' {
				url = m.Value.Text()
			}
		}
		return url
	}
	return ""
}

// checkTools checks the shape of a chat request's "tools" and legacy
// "functions" (OpenAI API reference, chat completions "tools"): each tool
// an object of type "function" with a "function" object, or of type
// "custom" with a "custom" object; each function (and custom tool) a
// non-empty string "name", a "description" string if any, "parameters" a
// JSON Schema object if any, "strict" a boolean if any. OpenAI refuses
// the others 400, and so does iop: a malformed tool would reach a
// provider that drops it or fails. A name's characters are
// left to the provider (OpenAI allows [a-zA-Z0-9_-], Ollama any). Errors
// are *FieldError naming the field, e.g. "tools[0].function.name".
func checkTools(tools, functions []jsonvalue.Value) error {
	checkFunction := func(fn *jsonvalue.Value, param string) error {
		if fn.Kind() != '{' {
			return &FieldError{Field: param, Message: "expected an object, got " + fn.TypeName()}
		}
		name, err := stringOf(fn.Get("name"), param+".name")
		if err != nil {
			return err
		}
		if name == "" {
			return &FieldError{Field: param + ".name", Message: "a function must have a name"}
		}
		if err := checkType(fn.Get("description"), param+".description", WantString); err != nil {
			return err
		}
		if err := checkType(fn.Get("parameters"), param+".parameters", WantObject); err != nil {
			return err
		}
		return checkType(fn.Get("strict"), param+".strict", WantBool)
	}
	for i := range tools {
		tool := &tools[i]
		param := fmt.Sprintf("tools[%d]", i)
		if tool.Kind() != '{' {
			return &FieldError{Field: param, Message: "expected an object, got " + tool.TypeName()}
		}
		typ, err := stringOf(tool.Get("type"), param+".type")
		if err != nil {
			return err
		}
		switch typ {
		case "function", "custom":
			if tool.Get(typ).Absent() {
				return &FieldError{Field: param + "." + typ, Message: fmt.Sprintf("a tool of type %q must have a %q object", typ, typ)}
			}
			if err := checkFunction(tool.Get(typ), param+"."+typ); err != nil {
				return err
			}
		case "":
			return &FieldError{Field: param + ".type", Message: `each tool must have a type: "function"`}
		default:
			return &FieldError{Field: param + ".type", Message: fmt.Sprintf(`must be "function" or "custom", got %s`, strconv.Quote(Clip(typ)))}
		}
	}
	for i := range functions {
		if err := checkFunction(&functions[i], fmt.Sprintf("functions[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}

// toolChoiceOf checks "tool_choice" and "parallel_tool_calls" (OpenAI
// API reference, "Create chat completion") against the request's tools,
// and reports whether they constrain the tool use beyond what Ollama can
// honour (NeedToolChoice): parallel_tool_calls false with tools, unless
// tool_choice forces a call ("required", a named function, allowed tools
// of mode "required"), whose answer from an Ollama provider is one call.
func toolChoiceOf(top *jsonvalue.Value, tools []jsonvalue.Value) (constrained bool, err error) {
	parallel := top.Get("parallel_tool_calls")
	if err := checkType(parallel, "parallel_tool_calls", WantBool); err != nil {
		return false, err
	}
	forced, err := forcedChoiceOf(top, tools)
	return parallel.Kind() == 'f' && len(tools) > 0 && !forced, err
}

// forcedChoiceOf checks "tool_choice" against the request's tools and
// reports whether it forces a tool call.
func forcedChoiceOf(top *jsonvalue.Value, tools []jsonvalue.Value) (forced bool, err error) {
	tc := top.Get("tool_choice")
	if tc.Absent() {
		return false, nil
	}
	const choices = `"none", "auto", "required" or an object naming a function`
	switch tc.Kind() {
	case '"':
		switch mode := tc.Text(); mode {
		case "none", "auto":
			return false, nil
		case "required":
			if len(tools) == 0 {
				return false, &FieldError{Field: "tool_choice", Message: `"required" needs tools; the request has none`}
			}
			return true, nil
		default:
			return false, &FieldError{Field: "tool_choice", Message: fmt.Sprintf("must be %s, got %s", choices, strconv.Quote(Clip(mode)))}
		}
	case '{':
	default:
		return false, &FieldError{Field: "tool_choice", Message: fmt.Sprintf("expected %s, got %s", choices, tc.TypeName())}
	}
	typ, err := stringOf(tc.Get("type"), "tool_choice.type")
	if err != nil {
		return false, err
	}
	switch typ {
	case "":
		return false, &FieldError{Field: "tool_choice.type", Message: "a tool_choice object must have a type"}
	case "function":
		fn := tc.Get("function")
		if err := checkType(fn, "tool_choice.function", WantObject); err != nil {
			return false, err
		}
		name, err := stringOf(fn.Get("name"), "tool_choice.function.name")
		if err != nil {
			return false, err
		}
		if name == "" {
			return false, &FieldError{Field: "tool_choice.function.name", Message: "a function tool_choice must name the function"}
		}
		if !slices.Contains(toolNamesOf(tools), name) {
			return false, &FieldError{Field: "tool_choice.function.name",
				Message: fmt.Sprintf("names the function %s, which is not among the request's tools", strconv.Quote(Clip(name)))}
		}
		forced = true
	case "allowed_tools":
		allowed := tc.Get("allowed_tools")
		if err := checkType(allowed, "tool_choice.allowed_tools", WantObject); err != nil {
			return false, err
		}
		mode, err := stringOf(allowed.Get("mode"), "tool_choice.allowed_tools.mode")
		if err != nil {
			return false, err
		}
		if mode == "required" {
			if len(tools) == 0 {
				return false, &FieldError{Field: "tool_choice.allowed_tools.mode", Message: `"required" needs tools; the request has none`}
			}
			forced = true
		}
	}
	return forced, nil
}

// toolNamesOf are the function names of a request's tools, each read as
// encoding/json reads a tool into struct{Function struct{Name string}}:
// keys "function" and "name" match in any case, the last one counts, and
// a tool whose function or name is of another type has none.
func toolNamesOf(tools []jsonvalue.Value) []string {
	names := make([]string, 0, len(tools))
	for i := range tools {
		name, ok := "", true
		for j := range tools[i].Members {
			m := &tools[i].Members[j]
			if !strings.EqualFold(m.Key(), "function") {
				continue
			}
			switch m.Value.Kind() {
			case 'n':
				continue
			case '{':
			default:
				ok = false
				continue
			}
			for k := range m.Value.Members {
				n := &m.Value.Members[k]
				if !strings.EqualFold(n.Key(), "name") {
					continue
				}
				switch n.Value.Kind() {
				case '"':
					name = n.Value.Text()
				case 'n':
				default:
					ok = false
				}
			}
		}
		if ok && name != "" {
			names = append(names, name)
		}
	}
	return names
}

// reasoningOf checks the reasoning settings: "reasoning_effort" a
// string, "reasoning" an object whose "effort" is a string and "enabled"
// a boolean. Which efforts a model takes is its provider's to say.
func reasoningOf(top *jsonvalue.Value) (thinks bool, err error) {
	effort, err := stringOf(top.Get("reasoning_effort"), "reasoning_effort")
	if err != nil {
		return false, err
	}
	reasoning := top.Get("reasoning")
	if err := checkType(reasoning, "reasoning", WantObject); err != nil {
		return false, err
	}
	nestedEffort, err := stringOf(reasoning.Get("effort"), "reasoning.effort")
	if err != nil {
		return false, err
	}
	enabled, err := boolOf(reasoning.Get("enabled"), "reasoning.enabled")
	if err != nil {
		return false, err
	}
	thinks = enabled || (effort != "" && effort != "none") || (nestedEffort != "" && nestedEffort != "none")
	return thinks, nil
}

// toolCallsOf checks one message's "tool_calls", when present: an array
// of function tool calls. It returns the characters of their function names
// and arguments.
func toolCallsOf(v *jsonvalue.Value, param string) (chars int, err error) {
	if err := checkType(v, param, WantArray); err != nil {
		return 0, err
	}
	for j := range elemsOf(v) {
		call := &v.Elems[j]
		callParam := fmt.Sprintf("%s[%d]", param, j)
		if call.Kind() != '{' {
			return 0, &FieldError{Field: callParam, Message: "expected an object, got " + call.TypeName()}
		}
		typ, err := stringOf(call.Get("type"), callParam+".type")
		if err != nil {
			return 0, err
		}
		if !call.Get("type").Absent() && typ != "function" {
			return 0, &FieldError{Field: callParam + ".type",
				Message: "only function tool calls are supported, got " + strconv.Quote(Clip(typ))}
		}
		fn := call.Get("function")
		if err := checkType(fn, callParam+".function", WantObject); err != nil {
			return 0, err
		}
		if fn.Absent() {
			return 0, &FieldError{Field: callParam + ".function", Message: "each tool call must have a function"}
		}
		name := fn.Get("name")
		if err := checkType(name, callParam+".function.name", WantString); err != nil {
			return 0, err
		}
		if name.Absent() {
			return 0, &FieldError{Field: callParam + ".function.name", Message: "each tool call function must have a name"}
		}
		args := fn.Get("arguments")
		if err := checkType(args, callParam+".function.arguments", WantString); err != nil {
			return 0, err
		}
		chars += name.Runes
		if !args.Absent() {
			chars += args.Runes
		}
	}
	return chars, nil
}

// checkStop checks "stop": a string, or an array of at most
// maxStopSequences strings.
func checkStop(v *jsonvalue.Value) error {
	switch v.Kind() {
	case 0, 'n', '"': // absent, null, a string
		return nil
	case '[':
		if len(v.Elems) > maxStopSequences {
			return &FieldError{Field: "stop",
				Message: fmt.Sprintf("at most %d stop sequences are allowed, got %d", maxStopSequences, len(v.Elems))}
		}
		for i := range v.Elems {
			if v.Elems[i].Kind() != '"' {
				return &FieldError{Field: fmt.Sprintf("stop[%d]", i), Message: "expected a string, got " + v.Elems[i].TypeName()}
			}
		}
		return nil
	default:
		return &FieldError{Field: "stop",
			Message: fmt.Sprintf("expected a string or an array of at most %d strings, got %s", maxStopSequences, v.TypeName())}
	}
}

// checkResponseFormat checks "response_format": an object whose "type" is
// one of responseFormatTypes; for json_schema, "json_schema" must be an
// object with a string "name" and, if given, an object "schema".
func checkResponseFormat(rf *jsonvalue.Value) error {
	if rf.Absent() {
		return nil
	}
	if err := checkType(rf, "response_format", WantObject); err != nil {
		return err
	}
	typ, err := stringOf(rf.Get("type"), "response_format.type")
	if err != nil {
		return err
	}
	if typ == "" {
		return &FieldError{Field: "response_format.type", Message: "a response format must have a type"}
	}
	if !slices.Contains(responseFormatTypes, typ) {
		return &FieldError{Field: "response_format.type", Message: fmt.Sprintf("must be one of %s, got %s",
			strings.Join(responseFormatTypes, ", "), strconv.Quote(Clip(typ)))}
	}
	if typ != "json_schema" {
		return nil
	}
	js := rf.Get("json_schema")
	if err := checkType(js, "response_format.json_schema", WantObject); err != nil {
		return err
	}
	if js.Absent() {
		return &FieldError{Field: "response_format.json_schema", Message: "required when the response format type is json_schema"}
	}
	if err := checkType(js.Get("name"), "response_format.json_schema.name", WantString); err != nil {
		return err
	}
	if js.Get("name").Absent() {
		return &FieldError{Field: "response_format.json_schema.name", Message: "a json_schema response format must have a name"}
	}
	return checkType(js.Get("schema"), "response_format.json_schema.schema", WantObject)
}

// maxChoices is the largest "n" (OpenAI's limit).
const maxChoices = 128

// severalChoicesOf reports whether v, an "n" or "best_of" that passed
// its check, asks for more than one choice.
func severalChoicesOf(v *jsonvalue.Value) bool {
	if v.Kind() == 0 {
		return false
	}
	n, ok := parseInteger(string(v.Raw))
	return ok && n > 1
}
