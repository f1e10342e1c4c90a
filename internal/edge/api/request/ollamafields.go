package request

import (
	"bytes"
	"encoding/json"

	"iop/internal/edge/contract"
	"iop/internal/jsonvalue"
	"iop/internal/translate"
)

// ollamaMember is an OpenAI client's translate.ExtensionKey member: the
// Ollama-only fields it sends (docs/apis.md, "Endpoints"), as decoded with the
// rest of its body.
type ollamaMember struct {
	present bool             // the body has the member (null included)
	value   json.RawMessage  // its value; nil when null
	top     *jsonvalue.Value // the parsed body the member is in
}

// ollamaMemberOf returns the ExtensionKey member of a body's members (key
// matched exactly; a duplicated key counts by its last occurrence).
func ollamaMemberOf(top *jsonvalue.Value) ollamaMember {
	v := top.Get(translate.ExtensionKey)
	if v == nil {
		return ollamaMember{}
	}
	if v.Absent() {
		return ollamaMember{present: true, top: top}
	}
	return ollamaMember{present: true, value: v.Raw, top: top}
}

// moveTo takes the member out of req.Body (every occurrence, every other
// byte as it was, as translate.StripExtension does, from the spans of the
// one parse of the body: stripMembers) and makes its value the request's
// OllamaFields, which only an Ollama provider gets; a body without the
// member is left as it is. A value that is not an object is the node's to
// refuse (400 naming the member), as only an Ollama provider reads it.
func (m ollamaMember) moveTo(req *contract.Request) error {
	if !m.present {
		return nil
	}
	req.Body, req.OllamaFields = stripMembers(req.Body, m.top, translate.ExtensionKey), m.value
	return nil
}

// stripMembers returns body, whose parse is top (an object whose slices
// point into body), without its members of key key, every other byte as it
// was: what translate.StripExtension returns for it, without reading the
// body again.
func stripMembers(body []byte, top *jsonvalue.Value, key string) []byte {
	offset := func(sub []byte) int { return cap(body) - cap(sub) }
	type span struct{ start, end int }
	var cut []span
	prevEnd := offset(top.Raw) + 1 // just after '{' or the previous value
	first := true
	for i := range top.Members {
		m := &top.Members[i]
		end := offset(m.Value.Raw) + len(m.Value.Raw)
		if m.Is(key) {
			// As StripExtension: not the first member, cut from the end of
			// the previous value, taking the comma before this member; the
			// first, up to its value's end, and the comma after it below.
			cut = append(cut, span{prevEnd, end})
			if first {
				cut[len(cut)-1].start = -prevEnd
			}
		} else {
			first = false
		}
		prevEnd = end
	}
	if len(cut) == 0 {
		return body
	}
	out := make([]byte, 0, len(body))
	pos := 0
	for _, c := range cut {
		start, end := c.start, c.end
		if start < 0 {
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
	return append(out, body[pos:]...)
}
