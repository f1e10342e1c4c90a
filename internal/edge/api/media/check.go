package media

import (
	"encoding/json"
	"strconv"

	"iop/internal/edge/api"
)

// The routes' body checks: only what the edge needs (the model, to
// route) and what makes a request surely invalid for every server of the
// endpoint; anything else is the provider's to judge. Estimated tokens
// are characters / 4, rounded up.

// maxRerankDocuments bounds a rerank request's documents.
const maxRerankDocuments = 10_000

// stringField is f's member name as a string: "" when absent, unless
// required (then an error, as for an empty one).
func stringField(f fields, name string, required bool) (string, error) {
	raw, ok := f[name]
	if !ok || string(raw) == "null" {
		if required {
			return "", api.InvalidParam(name, "a non-empty string is required")
		}
		return "", nil
	}
	var v string
	if json.Unmarshal(raw, &v) != nil {
		return "", api.InvalidParam(name, "must be a string")
	}
	if required && v == "" {
		return "", api.InvalidParam(name, "a non-empty string is required")
	}
	return v, nil
}

// tokensOf is chars / 4, rounded up.
func tokensOf(chars int) int { return (chars + 3) / 4 }

// checkRerank: query, a non-empty string; documents, 1 to 10,000 strings
// or objects (Jina's and Cohere's {"text": ...}); top_n, an integer >= 0.
func checkRerank(f fields) (int, error) {
	query, err := stringField(f, "query", true)
	if err != nil {
		return 0, err
	}
	var docs []json.RawMessage
	if json.Unmarshal(f["documents"], &docs) != nil || len(docs) == 0 || len(docs) > maxRerankDocuments {
		return 0, api.InvalidParam("documents", "an array of 1 to "+strconv.Itoa(maxRerankDocuments)+" documents is required")
	}
	chars := len(query)
	for i, d := range docs {
		if len(d) == 0 || (d[0] != '"' && d[0] != '{') {
			return 0, api.InvalidParam("documents", "documents["+strconv.Itoa(i)+"] must be a string or an object")
		}
		chars += len(d)
	}
	if raw, ok := f["top_n"]; ok && string(raw) != "null" {
		var n int
		if json.Unmarshal(raw, &n) != nil || n < 0 {
			return 0, api.InvalidParam("top_n", "must be an integer >= 0")
		}
	}
	return tokensOf(chars), nil
}

// checkSpeech: input, a non-empty string.
func checkSpeech(f fields) (int, error) {
	input, err := stringField(f, "input", true)
	return tokensOf(len(input)), err
}

// checkImages: prompt, a non-empty string.
func checkImages(f fields) (int, error) {
	prompt, err := stringField(f, "prompt", true)
	return tokensOf(len(prompt)), err
}

// checkInfill: input_prefix and input_suffix, strings when present
// (llama.cpp's /infill).
func checkInfill(f fields) (int, error) {
	prefix, err := stringField(f, "input_prefix", false)
	if err != nil {
		return 0, err
	}
	suffix, err := stringField(f, "input_suffix", false)
	if err != nil {
		return 0, err
	}
	return tokensOf(len(prefix) + len(suffix) + len(f["input_extra"]) + len(f["prompt"])), nil
}

// checkLlamaCompletion: prompt, required (a string, tokens, or the mixed
// arrays llama.cpp's /completion takes).
func checkLlamaCompletion(f fields) (int, error) {
	raw, ok := f["prompt"]
	if !ok || string(raw) == "null" {
		return 0, api.InvalidParam("prompt", "a prompt is required")
	}
	return tokensOf(len(raw)), nil
}
