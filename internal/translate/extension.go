package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
)

// ErrNotObject is returned for a request body that is not one JSON object.
var ErrNotObject = errors.New("request body is not a JSON object")

// ApplyExtension returns ollamaBody (an Ollama /api/chat or /api/generate
// body an adapter translated from canonical) with the fields canonical
// carries under ExtensionKey set on it, their JSON values unchanged. A field
// the translation already set keeps the translated value; "options" members
// are merged the same way, and so are the members of each object of
// "messages" into the message of the same index (one the body does not
// have is ignored). Without the member, ollamaBody is returned as it is.
// Errors: ErrNotObject when the member, its "options" or "messages" (an
// array of objects) or ollamaBody is not of its shape, or canonical is not
// JSON. It returns the names it set ("keep_alive", "options.num_ctx",
// "messages[1].thinking"), sorted.
func ApplyExtension(ollamaBody, canonical []byte) ([]byte, []string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(canonical, &top); err != nil {
		return nil, nil, ErrNotObject
	}
	raw, ok := top[ExtensionKey]
	if !ok || isNull(raw) {
		return ollamaBody, nil, nil
	}
	var ext map[string]json.RawMessage
	if err := json.Unmarshal(raw, &ext); err != nil || ext == nil {
		return nil, nil, ErrNotObject
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(ollamaBody, &body); err != nil || body == nil {
		return nil, nil, ErrNotObject
	}
	var set []string
	for k, v := range ext {
		if k == "options" || k == "messages" {
			continue
		}
		if _, taken := body[k]; !taken {
			body[k] = v
			set = append(set, k)
		}
	}
	if rawOpts, ok := ext["options"]; ok && !isNull(rawOpts) {
		var extOpts, opts map[string]json.RawMessage
		if err := json.Unmarshal(rawOpts, &extOpts); err != nil {
			return nil, nil, ErrNotObject
		}
		if o, ok := body["options"]; ok && !isNull(o) {
			if err := json.Unmarshal(o, &opts); err != nil {
				return nil, nil, ErrNotObject
			}
		}
		if opts == nil {
			opts = make(map[string]json.RawMessage, len(extOpts))
		}
		for k, v := range extOpts {
			if _, taken := opts[k]; !taken {
				opts[k] = v
				set = append(set, "options."+k)
			}
		}
		merged, err := json.Marshal(opts)
		if err != nil {
			return nil, nil, err
		}
		body["options"] = merged
	}
	if rawMsgs, ok := ext["messages"]; ok && !isNull(rawMsgs) {
		msgsSet, err := mergeMessages(body, rawMsgs)
		if err != nil {
			return nil, nil, err
		}
		set = append(set, msgsSet...)
	}
	out, err := json.Marshal(body)
	if err != nil {
		return nil, nil, err
	}
	sort.Strings(set)
	return out, set, nil
}

// mergeMessages sets the members of each object of extMsgs (ExtensionKey's
// "messages") on body's message of the same index, where not already set.
func mergeMessages(body map[string]json.RawMessage, extMsgs json.RawMessage) ([]string, error) {
	var fields []map[string]json.RawMessage
	if err := json.Unmarshal(extMsgs, &fields); err != nil {
		return nil, ErrNotObject
	}
	var msgs []map[string]json.RawMessage
	if raw, ok := body["messages"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &msgs); err != nil {
			return nil, ErrNotObject
		}
	}
	var set []string
	for i, f := range fields {
		if i >= len(msgs) || msgs[i] == nil {
			break
		}
		for k, v := range f {
			if _, taken := msgs[i][k]; !taken && !isNull(v) {
				msgs[i][k] = v
				set = append(set, fmt.Sprintf("messages[%d].%s", i, k))
			}
		}
	}
	if len(set) == 0 {
		return nil, nil
	}
	merged, err := json.Marshal(msgs)
	if err != nil {
		return nil, err
	}
	body["messages"] = merged
	return set, nil
}

// StripExtension returns body without its top-level ExtensionKey member(s),
// every other byte as it was, and whether it removed any; without one it
// returns body itself. A tunnel calls it before relaying a canonical body
// to an OpenAI-compatible provider, which knows no such member. body is
// outside input (fuzzed by FuzzStripExtension); it must be exactly one JSON
// object, else the error is ErrNotObject.
func StripExtension(body []byte) ([]byte, bool, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false, ErrNotObject
	}
	type span struct{ start, end int }
	var cut []span
	prevEnd := int(dec.InputOffset()) // just after '{' or the previous value
	first := true
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return nil, false, ErrNotObject
		}
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, false, ErrNotObject
		}
		end := int(dec.InputOffset())
		if key == ExtensionKey {
			// Not the first member: cut from the end of the previous value,
			// taking the comma before this member. The first: cut up to its
			// value's end, and the comma after it below.
			cut = append(cut, span{prevEnd, end})
			if first {
				cut[len(cut)-1].start = -prevEnd // marks "first member"
			}
		} else {
			first = false
		}
		prevEnd = end
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, false, ErrNotObject
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false, ErrNotObject
	}
	if len(cut) == 0 {
		return body, false, nil
	}
	out := make([]byte, 0, len(body))
	pos := 0
	for _, c := range cut {
		start, end := c.start, c.end
		if start < 0 {
			// A leading member (all members before it were removed too):
			// drop it and the comma that follows, if another member does.
			start = -start
			rest := bytes.TrimLeft(body[end:], " \t\r\n")
			if len(rest) > 0 && rest[0] == ',' {
				end = len(body) - len(rest) + 1
			}
		}
		if start < pos {
			start = pos
		}
		out = append(out, body[pos:start]...)
		pos = end
	}
	return append(out, body[pos:]...), true, nil
}
