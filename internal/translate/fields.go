package translate

import (
	"bytes"
	"encoding/json"
	"slices"
)

// OllamaFields are the Ollama request fields OpenAI's API has no name for,
// parsed from their JSON form (ParseOllamaFields): an object whose members
// are those fields with their JSON values unchanged ("keep_alive": "24h",
// "think": true, an untranslated top-level field), "options" (an object)
// with the model options that are not OpenAI parameters (num_ctx, top_k,
// ...), and "messages" (an array of objects) with per-message fields
// ("thinking"), by index. For example:
//
//	{"keep_alive":"24h","think":true,"options":{"num_ctx":8192},
//	 "messages":[{},{"thinking":"..."}]}
//
// The edge finds them in an Ollama client's request (Request.OllamaFields)
// or in an OpenAI client's ExtensionKey member and sends them to the node
// apart from the canonical body (the Dispatch's ollama_fields); the node's
// Ollama adapter sets them on the Ollama request it translates the body
// into (ToOllamaChat, ToOllamaGenerate, ToOllamaEmbed), and an
// OpenAI-compatible provider never gets them. A nil *OllamaFields has no
// fields. Values are immutable once parsed and safe for concurrent use.
type OllamaFields struct {
	top     map[string]json.RawMessage   // every member but options and messages
	opts    map[string]json.RawMessage   // "options", when hasOpts
	hasOpts bool                         // "options" is present and not null
	msgs    []map[string]json.RawMessage // "messages", nil when absent or null
}

// ParseOllamaFields parses the JSON form of OllamaFields. Empty input and
// null have no fields (nil, nil). Errors: ErrNotObject when raw is not a
// JSON object, or its "options" is not an object, or its "messages" not an
// array of objects (null counts as absent for both).
func ParseOllamaFields(raw []byte) (*OllamaFields, error) {
	if len(bytes.TrimSpace(raw)) == 0 || isNull(raw) {
		return nil, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil || top == nil {
		return nil, ErrNotObject
	}
	f := &OllamaFields{top: top}
	if o, ok := top["options"]; ok {
		delete(top, "options")
		if !isNull(o) {
			if err := json.Unmarshal(o, &f.opts); err != nil {
				return nil, ErrNotObject
			}
			f.hasOpts = true
		}
	}
	if m, ok := top["messages"]; ok {
		delete(top, "messages")
		if !isNull(m) {
			if err := json.Unmarshal(m, &f.msgs); err != nil {
				return nil, ErrNotObject
			}
		}
	}
	return f, nil
}

// Has reports whether f has the top-level field name (null counts: the
// field is set to null); f may be nil.
func (f *OllamaFields) Has(name string) bool { return f.has(name) }

// has reports whether f has the top-level field name (null counts: the
// field is set to null).
func (f *OllamaFields) has(name string) bool {
	if f == nil {
		return false
	}
	_, ok := f.top[name]
	return ok
}

// encode marshals out, an Ollama request built by a translation, with f's
// fields set on it where out does not set them already: a field out sets
// (has reports it) keeps out's value; f's "options" members are merged
// into *opts the same way (opts nil: out has no options field of its own),
// and the members of each object of f's "messages" (null ones skipped)
// into the message of *msgs of the same index (one out does not have is
// ignored). opts and msgs point into out. Without fields it is
// json.Marshal(out); with them, out is encoded once and the fields are
// appended to the objects they belong to: nothing is decoded again.
func (f *OllamaFields) encode(out any, has func(string) bool, opts **ollamaOptions, msgs *[]ollamaMessage) ([]byte, error) {
	if f == nil {
		return marshal(out)
	}
	extra := make(map[string]json.RawMessage, len(f.top)+2)
	for k, v := range f.top {
		if !has(k) {
			extra[k] = v
		}
	}
	if f.hasOpts {
		var base *ollamaOptions
		if opts != nil {
			base, *opts = *opts, nil // encoded below, with the merged members
			defer func() { *opts = base }()
		}
		merged, err := json.Marshal(base)
		if base == nil {
			merged = []byte("{}")
		} else if err != nil {
			return nil, err
		}
		more := make(map[string]json.RawMessage, len(f.opts))
		for k, v := range f.opts {
			if !base.has(k) {
				more[k] = v
			}
		}
		extra["options"] = appendMembers(merged, more)
	}
	if msgs != nil && len(f.msgs) > 0 {
		raw, err := mergeMessages(*msgs, f.msgs)
		if err != nil {
			return nil, err
		}
		if raw != nil {
			saved := *msgs
			*msgs = nil // encoded as raw
			defer func() { *msgs = saved }()
			extra["messages"] = raw
		}
	}
	b, err := marshal(out)
	if err != nil {
		return nil, err
	}
	return appendMembers(b, extra), nil
}

// mergeMessages encodes msgs with the members of fields[i] set on msgs[i]
// where it does not set them (null values skipped); nil when no member
// is set.
func mergeMessages(msgs []ollamaMessage, fields []map[string]json.RawMessage) (json.RawMessage, error) {
	extra := make([]map[string]json.RawMessage, len(msgs))
	set := false
	for i, f := range fields {
		if i >= len(msgs) {
			break
		}
		for k, v := range f {
			if !msgs[i].has(k) && !isNull(v) {
				if extra[i] == nil {
					extra[i] = make(map[string]json.RawMessage, len(f))
				}
				extra[i][k] = v
				set = true
			}
		}
	}
	if !set {
		return nil, nil
	}
	out := []byte{'['}
	for i := range msgs {
		b, err := msgs[i].appendJSON(nil)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, appendMembers(b, extra[i])...)
	}
	return append(out, ']'), nil
}

// appendMembers returns the JSON object obj (encoding/json's compact
// output, ending in '}') with members appended, by sorted key.
func appendMembers(obj []byte, members map[string]json.RawMessage) []byte {
	if len(members) == 0 {
		return obj
	}
	keys := make([]string, 0, len(members))
	for k := range members {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := obj[:len(obj)-1]
	empty := len(out) == 1 // just "{"
	for _, k := range keys {
		if !empty {
			out = append(out, ',')
		}
		empty = false
		name, _ := json.Marshal(k) // a string always marshals
		out = append(out, name...)
		out = append(out, ':')
		out = append(out, members[k]...)
	}
	return append(out, '}')
}

// has reports whether o sets the option name.
func (o *ollamaOptions) has(name string) bool {
	if o == nil {
		return false
	}
	switch name {
	case "num_predict":
		return o.NumPredict != nil
	case "temperature":
		return o.Temperature != nil
	case "top_p":
		return o.TopP != nil
	case "stop":
		return len(o.Stop) > 0
	case "seed":
		return o.Seed != nil
	case "frequency_penalty":
		return o.FrequencyPenalty != nil
	case "presence_penalty":
		return o.PresencePenalty != nil
	}
	return false
}

// has reports whether m's encoding has the member name.
func (m *ollamaMessage) has(name string) bool {
	switch name {
	case "role", "content":
		return true
	case "images":
		return len(m.Images) > 0
	case "tool_calls":
		return len(m.ToolCalls) > 0
	case "tool_name":
		return m.ToolName != ""
	case "thinking":
		return m.Thinking != ""
	}
	return false
}
