package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// errNotObject is returned by rewriteModel for a body that is not one JSON
// object.
var errNotObject = errors.New("request body is not a JSON object")

// rewriteModel returns body with the value of every top-level "model" member
// replaced by model as a JSON string; every other byte is kept as it was
// (member order, whitespace, number spelling, unknown fields). A body
// without a top-level "model" gets one, first. A body whose every "model"
// already is model (as decoded: "ll\u0061ma" is "llama") is returned
// itself, not a copy: nothing in it changes. body is outside input
// (fuzzed by FuzzRewriteModel); it must be exactly one JSON object, else
// the error is errNotObject.
//
// The common case, a body whose model already is the served name, is told
// without decoding the body (modelAlready: a validity check and a scan of
// its top-level keys, no allocation), and the body goes as it came.
func rewriteModel(body []byte, model string) ([]byte, error) {
	if modelAlready(body, model) {
		return body, nil
	}
	quoted, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errNotObject
	}
	open := int(dec.InputOffset()) // just after '{'
	type span struct{ start, end int }
	var spans []span
	members := 0
	same := true // every "model" member already is model
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, errNotObject
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, errNotObject
		}
		members++
		if key != "model" {
			continue
		}
		var name string
		if json.Unmarshal(value, &name) != nil || name != model {
			same = false
		}
		end := int(dec.InputOffset())
		start := end - len(value)
		if start < 0 || !bytes.Equal(body[start:end], value) {
			return nil, errNotObject // cannot happen with encoding/json's decoder
		}
		spans = append(spans, span{start, end})
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, errNotObject
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errNotObject // trailing data
	}

	if len(spans) > 0 && same {
		return body, nil
	}
	out := make([]byte, 0, len(body)+len(quoted)+16)
	if len(spans) == 0 {
		out = append(out, body[:open]...)
		out = append(out, `"model":`...)
		out = append(out, quoted...)
		if members > 0 {
			out = append(out, ',')
		}
		return append(out, body[open:]...), nil
	}
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s.start]...)
		out = append(out, quoted...)
		prev = s.end
	}
	return append(out, body[prev:]...), nil
}

// modelAlready reports whether body is one JSON object with at least one
// top-level "model" member and every one of them the string model, told
// without decoding: json.Valid, then a scan of the top-level keys that
// skips strings and nested values. It answers false when it cannot tell
// cheaply (a key or the model value written with an escape); rewriteModel
// then decodes.
func modelAlready(body []byte, model string) bool {
	if !json.Valid(body) {
		return false
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	found := false
	depth := 0
	expectKey := true // at depth 0: the next string is a key
	for i++; i < len(body); i++ {
		switch c := body[i]; c {
		case '"':
			end, escaped := stringEnd(body, i)
			if depth == 0 && expectKey {
				key := body[i+1 : end]
				if escaped {
					return false
				}
				if string(key) == "model" {
					j := skipSpace(body, skipSpace(body, end+1)+1) // past ':'
					if j >= len(body) || body[j] != '"' {
						return false
					}
					vend, vesc := stringEnd(body, j)
					if vesc || string(body[j+1:vend]) != model {
						return false
					}
					found = true
					i = vend
					expectKey = false
					continue
				}
				expectKey = false
			}
			i = end
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			if depth == 0 {
				expectKey = true
			}
		}
	}
	return found
}

// stringEnd returns the index of the closing quote of the valid JSON
// string that opens at body[start], and whether it has an escape.
func stringEnd(body []byte, start int) (end int, escaped bool) {
	for i := start + 1; i < len(body); i++ {
		switch body[i] {
		case '\\':
			escaped = true
			i++
		case '"':
			return i, escaped
		}
	}
	return len(body), escaped
}

func skipSpace(body []byte, i int) int {
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n') {
		i++
	}
	return i
}
