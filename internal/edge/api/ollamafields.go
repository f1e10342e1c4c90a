package api

import (
	"encoding/json"

	"iop/internal/translate"
)

// ollamaMember is an OpenAI client's translate.ExtensionKey member: the
// Ollama-only fields it sends (README, "Ollama API"), as decoded with the
// rest of its body.
type ollamaMember struct {
	present bool            // the body has the member (null included)
	value   json.RawMessage // its value; nil when null
}

// ollamaMemberOf returns the ExtensionKey member of a body's members (key
// matched exactly; a duplicated key counts by its last occurrence).
func ollamaMemberOf(top map[string]json.RawMessage) ollamaMember {
	raw, ok := top[translate.ExtensionKey]
	if !ok {
		return ollamaMember{}
	}
	if isAbsent(raw) {
		raw = nil
	}
	return ollamaMember{present: true, value: raw}
}

// moveTo takes the member out of req.Body (every occurrence, every other
// byte as it was: translate.StripExtension) and makes its value the
// request's OllamaFields, which only an Ollama provider gets; a body
// without the member is left as it is. A value that is not an object is
// the node's to refuse (400 naming the member), as only an Ollama provider
// reads it.
func (m ollamaMember) moveTo(req *Request) error {
	if !m.present {
		return nil
	}
	body, _, err := translate.StripExtension(req.Body)
	if err != nil {
		return &requestError{message: "the request body must be a JSON object"}
	}
	req.Body, req.OllamaFields = body, m.value
	return nil
}
