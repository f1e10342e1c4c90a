package sim

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
)

// jsonAny is a request's ask for JSON without a schema: OpenAI's
// response_format {"type":"json_object"}, Ollama's "format": "json".
var jsonAny = json.RawMessage(`"json"`)

// openaiFormat is the JSON a response_format asks for: its json_schema's
// schema, jsonAny for json_object (or a json_schema without a schema),
// nil for text or none.
func openaiFormat(rf *openaiResponseFormat) json.RawMessage {
	switch {
	case rf == nil:
		return nil
	case rf.Type == "json_schema" && rf.JSONSchema != nil && len(rf.JSONSchema.Schema) > 0:
		return rf.JSONSchema.Schema
	case rf.Type == "json_schema", rf.Type == "json_object":
		return jsonAny
	}
	return nil
}

// openaiResponseFormat is a chat request's "response_format".
type openaiResponseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// ollamaFormat is the JSON an Ollama "format" asks for: a JSON schema (an
// object), jsonAny for "json", nil for none.
func ollamaFormat(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0, string(raw) == "null", string(raw) == `""`:
		return nil
	case raw[0] == '{':
		return raw
	}
	return jsonAny
}

// structuredAnswer is the answer to a request for JSON (structured
// output), as a model constrained to it writes it: for a schema, a value
// of that schema (every property of an object, in sorted order; one item
// for an array; an enum's first value; 42 for a number or integer, true
// for a boolean, a word for a string); without one, {"answer": words}.
// Its tokens are pieces of that JSON text of argumentPieceRunes
// characters.
func structuredAnswer(rng *rand.Rand, format json.RawMessage) []string {
	var b strings.Builder
	if bytes.Equal(format, jsonAny) {
		words := make([]string, 3)
		for i := range words {
			words[i] = vocabulary[rng.IntN(len(vocabulary))]
		}
		answer, _ := json.Marshal(strings.Join(words, " "))
		b.WriteString(`{"answer":`)
		b.Write(answer)
		b.WriteByte('}')
	} else {
		writeSchemaValue(&b, rng, format, 0)
	}
	return splitRunes(b.String(), argumentPieceRunes)
}

// maxSchemaDepth bounds the nesting writeSchemaValue follows.
const maxSchemaDepth = 8

// writeSchemaValue writes a JSON value of schema (a JSON Schema object).
func writeSchemaValue(b *strings.Builder, rng *rand.Rand, schema json.RawMessage, depth int) {
	var s struct {
		Type       json.RawMessage            `json:"type"`
		Enum       []json.RawMessage          `json:"enum"`
		Const      json.RawMessage            `json:"const"`
		Properties map[string]json.RawMessage `json:"properties"`
		Items      json.RawMessage            `json:"items"`
		AnyOf      []json.RawMessage          `json:"anyOf"`
	}
	_ = json.Unmarshal(schema, &s) // no usable schema: a word
	if depth > maxSchemaDepth {
		b.WriteString("null")
		return
	}
	switch {
	case len(s.Const) > 0:
		b.Write(s.Const)
		return
	case len(s.Enum) > 0:
		b.Write(s.Enum[0])
		return
	case len(s.AnyOf) > 0:
		writeSchemaValue(b, rng, s.AnyOf[0], depth+1)
		return
	}
	typ := ""
	var types []string
	if json.Unmarshal(s.Type, &typ) != nil && json.Unmarshal(s.Type, &types) == nil {
		for _, t := range types {
			if t != "null" {
				typ = t
				break
			}
		}
	}
	if typ == "" && s.Properties != nil {
		typ = "object"
	}
	switch typ {
	case "object":
		names := make([]string, 0, len(s.Properties))
		for name := range s.Properties {
			names = append(names, name)
		}
		slices.Sort(names)
		b.WriteByte('{')
		for i, name := range names {
			if i > 0 {
				b.WriteByte(',')
			}
			key, _ := json.Marshal(name)
			b.Write(key)
			b.WriteByte(':')
			writeSchemaValue(b, rng, s.Properties[name], depth+1)
		}
		b.WriteByte('}')
	case "array":
		b.WriteByte('[')
		writeSchemaValue(b, rng, s.Items, depth+1)
		b.WriteByte(']')
	case "integer", "number":
		b.WriteString("42")
	case "boolean":
		b.WriteString("true")
	case "null":
		b.WriteString("null")
	default:
		word, _ := json.Marshal(vocabulary[rng.IntN(len(vocabulary))])
		b.Write(word)
	}
}
