package request

import (
	"encoding/json"
	"fmt"
	"iop/internal/jsonvalue"
	"math"
	"sync/atomic"
)

// maxInputs bounds the items of a batched prompt or embeddings input
// (OpenAI's limit for embeddings).
const maxInputs = 2048

// textInput is what textInputOf found in a prompt or input.
type textInput struct {
	// Items is the number of prompts or inputs: 1 for a string or one
	// token array, else the array's length.
	Items int
	// Chars is the characters (code points) of its text; Tokens the number
	// of token ids it gives.
	Chars, Tokens int
	// TokenIDs is set when the input is given as token ids (an array of
	// token ids or of token id arrays), even empty ones.
	TokenIDs bool
}

// needs are the capabilities a completions prompt (batch: whether more
// than one prompt is a need) or an embeddings input requires of its
// provider: NeedPromptBatch for more than one item, NeedTokenInput for
// token ids.
func (in textInput) needs(batch bool) []string {
	var needs []string
	if batch && in.Items > 1 {
		needs = append(needs, NeedPromptBatch)
	}
	if in.TokenIDs {
		needs = append(needs, NeedTokenInput)
	}
	return needs
}

// estimatedTokens is the input's rough size in tokens: its token ids,
// plus its characters / 4 rounded up.
func (in textInput) estimatedTokens() int { return in.Tokens + (in.Chars+3)/4 }

// textInputOf checks a completions "prompt" or an embeddings "input"
// (OpenAI API reference): a string, an array of 1 to 2048 strings, an
// array of token ids (integers in [0, 2^31)), or an array of 1 to 2048
// such arrays. With nonEmpty, every string and token array must be
// non-empty (OpenAI's rule for embeddings input). Absent or null is an
// error: both fields are required. Errors are *FieldError naming param
// or the item, as in "input[3]".
func textInputOf(v *jsonvalue.Value, param string, nonEmpty bool) (textInput, error) {
	if v.Absent() {
		return textInput{}, &FieldError{Field: param, Message: "you must provide " + param}
	}
	const want = "a string, an array of strings, an array of token ids or an array of token id arrays"
	switch v.Kind() {
	case '"':
		if nonEmpty && v.Runes == 0 {
			return textInput{}, &FieldError{Field: param, Message: "must not be an empty string"}
		}
		return textInput{Items: 1, Chars: v.Runes}, nil
	case '[':
	default:
		return textInput{}, &FieldError{Field: param, Message: "expected " + want + ", got " + v.TypeName()}
	}
	items := v.Elems
	switch {
	case len(items) == 0:
		return textInput{}, &FieldError{Field: param, Message: "must not be an empty array"}
	case len(items) > maxInputs:
		return textInput{}, &FieldError{Field: param, Message: fmt.Sprintf("at most %d items are allowed, got %d", maxInputs, len(items))}
	}
	var in textInput
	switch items[0].Kind() {
	case '"': // strings
		in.Items = len(items)
		for i := range items {
			item := &items[i]
			itemParam := fmt.Sprintf("%s[%d]", param, i)
			if item.Kind() != '"' {
				return textInput{}, &FieldError{Field: itemParam, Message: "expected a string like the first item, got " + item.TypeName()}
			}
			if nonEmpty && item.Runes == 0 {
				return textInput{}, &FieldError{Field: itemParam, Message: "must not be an empty string"}
			}
			in.Chars += item.Runes
		}
	case '[': // token id arrays
		in.Items, in.TokenIDs = len(items), true
		for i := range items {
			n, err := tokenIDsOf(&items[i], fmt.Sprintf("%s[%d]", param, i), nonEmpty)
			if err != nil {
				return textInput{}, err
			}
			in.Tokens += n
		}
	default: // one token id array
		n, err := tokenIDsOf(v, param, nonEmpty)
		if err != nil {
			return textInput{}, err
		}
		in.Items, in.Tokens, in.TokenIDs = 1, n, true
	}
	return in, nil
}

// tokenIDsOf checks an array of token ids and returns its length.
func tokenIDsOf(v *jsonvalue.Value, param string, nonEmpty bool) (int, error) {
	if v.Kind() != '[' {
		return 0, &FieldError{Field: param, Message: "expected an array of token ids, got " + v.TypeName()}
	}
	if nonEmpty && len(v.Elems) == 0 {
		return 0, &FieldError{Field: param, Message: "must not be an empty array"}
	}
	for j := range v.Elems {
		id := &v.Elems[j]
		if err := checkInteger(id, fmt.Sprintf("%s[%d]", param, j), 0, math.MaxInt32); err != nil {
			return 0, err
		}
		if id.Absent() {
			return 0, &FieldError{Field: fmt.Sprintf("%s[%d]", param, j), Message: "expected a token id, got null"}
		}
	}
	return len(v.Elems), nil
}

// bodyParses counts jsonvalue.Parse's calls on a whole request body (parseBody):
// a test hook, so a test can tell that each route parses the client's
// bytes once.
var bodyParses atomic.Int64

// BodyParses is how many whole request bodies this package parsed since
// the process started (a test hook, as translate.BodyDecodes, so a client
// API's tests can tell that its routes parse no body twice).
func BodyParses() int64 { return bodyParses.Load() }

// parseBody parses a request body that must be one JSON object, once.
// Errors are *FieldError with no param, worded as decodeObject words
// them (the body not valid JSON, with encoding/json's own error text; not
// an object; null).
func parseBody(body []byte) (*jsonvalue.Value, error) {
	bodyParses.Add(1)
	v, err := jsonvalue.Parse(body)
	if err != nil {
		// Only an invalid body gets here: encoding/json words the error
		// (its text is part of the answer, and the tests hold it).
		var top map[string]json.RawMessage
		if jerr := json.Unmarshal(body, &top); jerr != nil {
			return nil, &FieldError{Message: "the request body is not valid JSON: " + jerr.Error()}
		}
		return nil, &FieldError{Message: "the request body is not valid JSON"}
	}
	switch v.Kind() {
	case '{':
		return v, nil
	case 'n':
		return nil, &FieldError{Message: "the request body must be a JSON object, got null"}
	default:
		return nil, &FieldError{Message: "the request body must be a JSON object, got " + jsonKind(body)}
	}
}
