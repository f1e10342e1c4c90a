package translate

import (
	"bytes"
	"encoding/json"

	"iop/internal/jsonscan"
)

// TakeOllamaStop removes options.stop from an Ollama /api/chat or
// /api/generate body (as ToOllamaChat and ToOllamaGenerate make one, the
// client's Ollama fields included) and returns the body without it and
// the stop sequences, in order; a body without them is returned as it is
// with nil. Ollama answers done_reason "stop" both for a stop sequence
// and for the model's own end, so a node that must say which stop
// sequence ended an answer matches them itself. Errors are *FieldError:
// options.stop neither a string nor an array of strings, or more than 4.
func TakeOllamaStop(body []byte) ([]byte, []string, error) {
	if !bytes.Contains(body, []byte(`"stop"`)) || !hasOptionsStop(body) {
		return body, nil, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return body, nil, nil // not an object: nothing to take
	}
	var opts map[string]json.RawMessage
	if raw, ok := top["options"]; !ok || json.Unmarshal(raw, &opts) != nil {
		return body, nil, nil
	}
	raw, ok := opts["stop"]
	if !ok {
		return body, nil, nil
	}
	stop, err := stringOrStrings(raw, "options.stop")
	if err != nil {
		return nil, nil, err
	}
	if len(stop) > maxStop {
		return nil, nil, fieldErr("options.stop", "at most %d stop sequences are supported, got %d", maxStop, len(stop))
	}
	delete(opts, "stop")
	if len(opts) == 0 {
		delete(top, "options")
	} else if top["options"], err = json.Marshal(opts); err != nil {
		return nil, nil, err
	}
	out, err := json.Marshal(top)
	if err != nil {
		return nil, nil, err
	}
	return out, stop, nil
}

// hasOptionsStop reports whether body is a JSON object whose "options"
// (the last one, as encoding/json decodes a map) is an object with a
// "stop" member: read in place, so that a body whose text merely says
// "stop" is not decoded.
func hasOptionsStop(body []byte) bool {
	opts := -1
	_, _, ok := jsonscan.Object(body, func(key []byte, flags int, vstart, _ int) {
		if jsonscan.KeyIs(key, flags, "options") {
			opts = vstart
		}
	})
	if !ok || opts < 0 || body[opts] != '{' {
		return false
	}
	stop := false
	jsonscan.Members(body, opts, 2, func(key []byte, flags int, _, _ int) {
		stop = stop || jsonscan.KeyIs(key, flags, "stop")
	})
	return stop
}
