package adapter

import (
	"encoding/json"
	"errors"
	"net"
	"unicode/utf8"

	"iop/internal/jsonscan"
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
// (fuzzed by FuzzRewriteModel); it must be exactly one JSON object, as
// json.Valid tells it (FuzzScanObject), else the error is errNotObject.
//
// It reads body once (jsonscan.Object: a validity check that records the
// spans of the top-level "model" values, no allocation) and, when the
// model changes, builds the result in one allocation from those spans:
// only the "model" values' bytes differ. rewriteModelParts does the same
// without copying body.
func rewriteModel(body []byte, model string) ([]byte, error) {
	var s objectScan
	if !s.scan(body, model) {
		return nil, errNotObject
	}
	if s.n > 0 && s.same {
		return body, nil
	}
	var qbuf [64]byte
	quoted := appendQuoted(qbuf[:0], model)
	if s.n == 0 {
		out := make([]byte, 0, len(body)+len(`"model":,`)+len(quoted))
		out = append(out, body[:s.open]...)
		out = append(out, `"model":`...)
		out = append(out, quoted...)
		if s.members > 0 {
			out = append(out, ',')
		}
		return append(out, body[s.open:]...), nil
	}
	size := len(body)
	for i := range s.n {
		sp := s.span(i)
		size += len(quoted) - (sp.end - sp.start)
	}
	out := make([]byte, 0, size)
	prev := 0
	for i := range s.n {
		sp := s.span(i)
		out = append(out, body[prev:sp.start]...)
		out = append(out, quoted...)
		prev = sp.end
	}
	return append(out, body[prev:]...), nil
}

// spliceMinBytes is the body size from which the tunnel sends a rewritten
// body in parts (rewriteModelParts) rather than copied (rewriteModel): below
// it, one copy costs less than the parts' own allocations.
const spliceMinBytes = 16 << 10

// rewriteModelParts is rewriteModel's result as the parts to send one
// after the other: body's own bytes between the "model" values, and the
// new value between them; only body itself when nothing changes. It reads
// body once (jsonscan.Object: a validity check that records the spans of
// the top-level "model" values, no allocation) and copies none of it, so
// a 100 KiB body whose model is an alias goes to its provider without
// being copied.
func rewriteModelParts(body []byte, model string) (net.Buffers, error) {
	var s objectScan
	if !s.scan(body, model) {
		return nil, errNotObject
	}
	if s.n > 0 && s.same {
		return net.Buffers{body}, nil
	}
	quoted := appendQuoted(nil, model)
	if s.n == 0 {
		member := make([]byte, 0, len(`"model":,`)+len(quoted))
		member = append(member, `"model":`...)
		member = append(member, quoted...)
		if s.members > 0 {
			member = append(member, ',')
		}
		return net.Buffers{body[:s.open], member, body[s.open:]}, nil
	}
	parts := make(net.Buffers, 0, 2*s.n+1)
	prev := 0
	for i := range s.n {
		sp := s.span(i)
		parts = append(parts, body[prev:sp.start], quoted)
		prev = sp.end
	}
	return append(parts, body[prev:]), nil
}

// modelAlready reports whether body is one JSON object with at least one
// top-level "model" member and every one of them the string model (as
// decoded): rewriteModel would return body itself.
func modelAlready(body []byte, model string) bool {
	var s objectScan
	return s.scan(body, model) && s.n > 0 && s.same
}

// appendQuoted appends model as json.Marshal writes it: a name of plain
// printable ASCII as it is between quotes, anything else through
// json.Marshal (its escapes, and U+FFFD for invalid UTF-8).
func appendQuoted(dst []byte, model string) []byte {
	for i := 0; i < len(model); i++ {
		if c := model[i]; c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(model) // a string always marshals
			return append(dst, quoted...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, model...)
	return append(dst, '"')
}

// span is the byte range [start, end) of one value in a body.
type span struct{ start, end int }

// objectScan is what scan learned of a body: where its top-level object
// opens, how many members it has, the spans of its top-level "model"
// values and whether each of them is the model asked about. It lives on
// its caller's stack; only a body with more than len(first) "model"
// members allocates.
type objectScan struct {
	open    int // just after the top-level '{'
	members int
	n       int // top-level "model" members
	same    bool
	first   [2]span
	more    []span
}

func (s *objectScan) span(i int) span {
	if i < len(s.first) {
		return s.first[i]
	}
	return s.more[i-len(s.first)]
}

func (s *objectScan) add(sp span) {
	if s.n < len(s.first) {
		s.first[s.n] = sp
	} else {
		s.more = append(s.more, sp)
	}
	s.n++
}

// scan reports whether body is one JSON object (jsonscan.Object) and records
// in s its top-level "model" members (a key that decodes to "model",
// however escaped) and whether each value decodes to the string model.
func (s *objectScan) scan(body []byte, model string) bool {
	*s = objectScan{same: true}
	open, members, ok := jsonscan.Object(body, func(key []byte, keyFlags int, vstart, vend int) {
		if !jsonscan.KeyIs(key, keyFlags, "model") {
			return
		}
		s.add(span{vstart, vend})
		if s.same && !jsonscan.StringIs(body[vstart:vend], model) {
			s.same = false
		}
	})
	s.open, s.members = open, members
	return ok
}
