package translate

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// ErrNotObject is returned for a request body that is not one JSON object.
var ErrNotObject = errors.New("request body is not a JSON object")

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
