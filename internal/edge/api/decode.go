package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"strings"
	"unicode/utf8"
)

// Capabilities a request can need of its provider (Request.Needs).
const (
	needTools  = "tools"
	needVision = "vision"
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
	// order tools, vision.
	Needs []string
	// EstimatedInputTokens is the characters (Unicode code points) of all
	// message text / 4, rounded up.
	EstimatedInputTokens int
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
// and checks the JSON types of the well-known fields, so a malformed request
// is answered 400 here instead of by a provider after a queue wait.
//
// Keys match exactly (case-sensitive, as providers read them); a duplicated
// key counts by its last occurrence; null counts as absent. Message content
// may be a string, an array of content parts, or null; a part of type
// "image_url" makes the request need "vision", and a non-empty "tools" (or
// legacy "functions") array makes it need "tools".
//
// Every error is a *requestError whose param names the field in the form
// "messages[2].content[0].type" ("" when the body as a whole is not a JSON
// object).
func decodeChatRequest(body []byte) (chatRequest, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return chatRequest{}, &requestError{message: "the request body must be a JSON object, got " + jsonKind(body)}
		}
		return chatRequest{}, &requestError{message: "the request body is not valid JSON: " + err.Error()}
	}
	if top == nil {
		return chatRequest{}, &requestError{message: "the request body must be a JSON object, got null"}
	}

	var req chatRequest
	if err := decodeField(top, "model", wantString, &req.Model); err != nil {
		return chatRequest{}, err
	}
	if strings.TrimSpace(req.Model) == "" {
		return chatRequest{}, &requestError{param: "model", message: "you must provide a model parameter"}
	}

	chars, vision, err := decodeMessages(top["messages"])
	if err != nil {
		return chatRequest{}, err
	}
	req.EstimatedInputTokens = (chars + 3) / 4

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

	// Fields the API does not use, checked so that a wrong type fails fast.
	for _, f := range []struct {
		name string
		want string
		dst  any
	}{
		{"max_tokens", wantInteger, new(int64)},
		{"max_completion_tokens", wantInteger, new(int64)},
		{"n", wantInteger, new(int64)},
		{"seed", wantInteger, new(int64)},
		{"temperature", wantNumber, new(float64)},
		{"top_p", wantNumber, new(float64)},
		{"presence_penalty", wantNumber, new(float64)},
		{"frequency_penalty", wantNumber, new(float64)},
		{"user", wantString, new(string)},
	} {
		if err := decodeField(top, f.name, f.want, f.dst); err != nil {
			return chatRequest{}, err
		}
	}

	var tools, functions []json.RawMessage
	if err := decodeField(top, "tools", wantArray, &tools); err != nil {
		return chatRequest{}, err
	}
	if err := decodeField(top, "functions", wantArray, &functions); err != nil {
		return chatRequest{}, err
	}
	if len(tools) > 0 || len(functions) > 0 {
		req.Needs = append(req.Needs, needTools)
	}
	if vision {
		req.Needs = append(req.Needs, needVision)
	}
	return req, nil
}

// decodeMessages checks the "messages" array and returns the number of
// characters of its text and whether any content part is an image.
func decodeMessages(raw json.RawMessage) (chars int, vision bool, err error) {
	if isAbsent(raw) {
		return 0, false, &requestError{param: "messages", message: "you must provide a messages parameter"}
	}
	var messages []json.RawMessage
	if err := decodeValue(raw, "messages", wantArray, &messages); err != nil {
		return 0, false, err
	}
	if len(messages) == 0 {
		return 0, false, &requestError{param: "messages", message: "messages must contain at least one message"}
	}
	for i, rawMsg := range messages {
		param := fmt.Sprintf("messages[%d]", i)
		var msg map[string]json.RawMessage
		if err := decodeValue(rawMsg, param, wantObject, &msg); err != nil || msg == nil {
			return 0, false, &requestError{param: param, message: "expected an object, got " + jsonKind(rawMsg)}
		}
		var role string
		if err := decodeNested(msg, param+".role", "role", wantString, &role); err != nil {
			return 0, false, err
		}
		if role == "" {
			return 0, false, &requestError{param: param + ".role", message: "each message must have a role"}
		}
		n, v, err := decodeContent(msg["content"], param+".content")
		if err != nil {
			return 0, false, err
		}
		chars += n
		vision = vision || v
	}
	return chars, vision, nil
}

// decodeContent checks one message's content: a string, an array of content
// parts, or absent/null. It returns the characters of its text and whether a
// part is an image.
func decodeContent(raw json.RawMessage, param string) (chars int, vision bool, err error) {
	if isAbsent(raw) {
		return 0, false, nil
	}
	switch firstByte(raw) {
	case '"':
		var s string
		if err := decodeValue(raw, param, wantString, &s); err != nil {
			return 0, false, err
		}
		return utf8.RuneCountInString(s), false, nil
	case '[':
		var parts []json.RawMessage
		if err := decodeValue(raw, param, wantArray, &parts); err != nil {
			return 0, false, err
		}
		for j, rawPart := range parts {
			partParam := fmt.Sprintf("%s[%d]", param, j)
			var part map[string]json.RawMessage
			if err := decodeValue(rawPart, partParam, wantObject, &part); err != nil || part == nil {
				return 0, false, &requestError{param: partParam, message: "expected an object, got " + jsonKind(rawPart)}
			}
			var typ string
			if err := decodeNested(part, partParam+".type", "type", wantString, &typ); err != nil {
				return 0, false, err
			}
			switch typ {
			case "":
				return 0, false, &requestError{param: partParam + ".type", message: "each content part must have a type"}
			case "text":
				var text string
				if err := decodeNested(part, partParam+".text", "text", wantString, &text); err != nil {
					return 0, false, err
				}
				chars += utf8.RuneCountInString(text)
			case "image_url":
				vision = true
			}
		}
		return chars, vision, nil
	default:
		return 0, false, &requestError{param: param, message: "expected a string or an array of content parts, got " + jsonKind(raw)}
	}
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
