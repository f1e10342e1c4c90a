package adapter

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
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
// It reads body once (scanObject: a validity check that records the spans
// of the top-level "model" values, no allocation) and, when the model
// changes, builds the result in one allocation from those spans: only the
// "model" values' bytes differ.
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

// maxDepth is how deep arrays and objects may nest, as encoding/json's
// scanner allows (its maxNestingDepth): json.Valid rejects a deeper body.
const maxDepth = 10000

// scan reports whether body is one JSON object (scanObject) and records
// in s its top-level "model" members (a key that decodes to "model",
// however escaped) and whether each value decodes to the string model.
func (s *objectScan) scan(body []byte, model string) bool {
	*s = objectScan{same: true}
	open, members, ok := scanObject(body, func(key []byte, keyFlags int, vstart, vend int) {
		if !isKey(key, keyFlags, "model") {
			return
		}
		s.add(span{vstart, vend})
		if s.same && !stringValueIs(body[vstart:vend], model) {
			s.same = false
		}
	})
	s.open, s.members = open, members
	return ok
}

// scanObject reports whether body is one JSON object: what json.Valid
// accepts, with a '{' as its first byte past white space (FuzzScanObject).
// It calls member for each top-level member, in order, with its key
// (quotes included, and scanString's flags for it) and the span of its
// value in body; open is the index just after the object's '{', members
// how many it has. It does not allocate (member does not escape). A key or
// value with an escape, or with bytes that are not valid UTF-8, is for
// member to decode (isKey, stringValueIs).
func scanObject(body []byte, member func(key []byte, keyFlags int, vstart, vend int)) (open, members int, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false
	}
	open = i + 1
	i = skipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return open, 0, skipSpace(body, i+1) == len(body)
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return open, members, false
		}
		kend, kflags := scanString(body, i)
		if kend < 0 {
			return open, members, false
		}
		key := body[i:kend]
		i = skipSpace(body, kend)
		if i >= len(body) || body[i] != ':' {
			return open, members, false
		}
		vstart := skipSpace(body, i+1)
		vend := scanValue(body, vstart, 1)
		if vend < 0 {
			return open, members, false
		}
		members++
		member(key, kflags, vstart, vend)
		i = skipSpace(body, vend)
		if i >= len(body) {
			return open, members, false
		}
		switch body[i] {
		case ',':
			i = skipSpace(body, i+1)
		case '}':
			return open, members, skipSpace(body, i+1) == len(body)
		default:
			return open, members, false
		}
	}
}

// String flags scanString reports.
const (
	strEscaped = 1 << iota // has a backslash escape
	strHigh                // has a byte ≥ 0x80 (maybe not valid UTF-8)
)

// scanString returns the index just past the JSON string that opens at
// body[start] ('"'), and whether it has escapes or non-ASCII bytes; -1 if it
// is not a valid string (an unknown escape, a short \u, a control byte, no
// closing quote). Bytes ≥ 0x80 are not checked: json.Valid does not check
// UTF-8 either.
func scanString(body []byte, start int) (end int, flags int) {
	for i := start + 1; i < len(body); i++ {
		c := body[i]
		switch {
		case c == '"':
			return i + 1, flags
		case c == '\\':
			flags |= strEscaped
			i++
			if i >= len(body) {
				return -1, flags
			}
			switch body[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(body) {
					return -1, flags
				}
				for _, h := range body[i+1 : i+5] {
					if !isHex(h) {
						return -1, flags
					}
				}
				i += 4
			default:
				return -1, flags
			}
		case c < 0x20:
			return -1, flags
		case c >= utf8.RuneSelf:
			flags |= strHigh
		}
	}
	return -1, flags
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// isKey reports whether the JSON string quoted (quotes included, as
// scanString found it, with its flags) decodes to name.
func isKey(quoted []byte, flags int, name string) bool {
	if flags == 0 {
		return string(quoted[1:len(quoted)-1]) == name
	}
	return decodesTo(quoted, flags, name)
}

// stringValueIs reports whether the JSON value v decodes to the string
// name.
func stringValueIs(v []byte, name string) bool {
	if len(v) == 0 || v[0] != '"' {
		return false
	}
	_, flags := scanString(v, 0)
	return isKey(v, flags, name)
}

// decodesTo decodes the valid JSON string quoted and compares it with
// name: the slow path for escapes and non-ASCII bytes (encoding/json
// replaces invalid UTF-8 with U+FFFD, so raw bytes may differ from what
// they decode to).
func decodesTo(quoted []byte, flags int, name string) bool {
	if flags == strHigh && utf8.Valid(quoted) {
		return string(quoted[1:len(quoted)-1]) == name
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == name
}

// scanValue returns the index just past the JSON value that starts at
// body[i] (white space before it already skipped), nested depth deep (the
// top-level object is 1); -1 if there is no valid value there.
func scanValue(body []byte, i, depth int) int {
	if i >= len(body) {
		return -1
	}
	switch c := body[i]; {
	case c == '"':
		end, _ := scanString(body, i)
		return end
	case c == '{':
		if depth++; depth > maxDepth {
			return -1
		}
		i = skipSpace(body, i+1)
		if i < len(body) && body[i] == '}' {
			return i + 1
		}
		for {
			if i >= len(body) || body[i] != '"' {
				return -1
			}
			if i, _ = scanString(body, i); i < 0 {
				return -1
			}
			if i = skipSpace(body, i); i >= len(body) || body[i] != ':' {
				return -1
			}
			if i = scanValue(body, skipSpace(body, i+1), depth); i < 0 {
				return -1
			}
			if i = skipSpace(body, i); i >= len(body) {
				return -1
			}
			switch body[i] {
			case ',':
				i = skipSpace(body, i+1)
			case '}':
				return i + 1
			default:
				return -1
			}
		}
	case c == '[':
		if depth++; depth > maxDepth {
			return -1
		}
		i = skipSpace(body, i+1)
		if i < len(body) && body[i] == ']' {
			return i + 1
		}
		for {
			if i = scanValue(body, i, depth); i < 0 {
				return -1
			}
			if i = skipSpace(body, i); i >= len(body) {
				return -1
			}
			switch body[i] {
			case ',':
				i = skipSpace(body, i+1)
			case ']':
				return i + 1
			default:
				return -1
			}
		}
	case c == '-' || '0' <= c && c <= '9':
		return scanNumber(body, i)
	case c == 't':
		return literal(body, i, "true")
	case c == 'f':
		return literal(body, i, "false")
	case c == 'n':
		return literal(body, i, "null")
	}
	return -1
}

func literal(body []byte, i int, word string) int {
	if len(body)-i < len(word) || string(body[i:i+len(word)]) != word {
		return -1
	}
	return i + len(word)
}

// scanNumber returns the index just past the JSON number at body[i]
// (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), -1 if there is none.
func scanNumber(body []byte, i int) int {
	if body[i] == '-' {
		i++
	}
	switch {
	case i >= len(body):
		return -1
	case body[i] == '0':
		i++
	case '1' <= body[i] && body[i] <= '9':
		i = digits(body, i)
	default:
		return -1
	}
	if i < len(body) && body[i] == '.' {
		j := digits(body, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(body) && (body[i] == 'e' || body[i] == 'E') {
		i++
		if i < len(body) && (body[i] == '+' || body[i] == '-') {
			i++
		}
		j := digits(body, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func digits(body []byte, i int) int {
	for i < len(body) && '0' <= body[i] && body[i] <= '9' {
		i++
	}
	return i
}

func skipSpace(body []byte, i int) int {
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n') {
		i++
	}
	return i
}
