package api

import (
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonValue is one JSON value of a request body as parseJSON read it, in
// one pass over the body's bytes: the request decoders (decodeChatRequest,
// decodeCompletionRequest, decodeEmbeddingsRequest) check it, and take the
// needs and the estimated input tokens from it, without decoding any part
// of the body again.
type jsonValue struct {
	// raw is the value's bytes, a subslice of the body, without the space
	// around it; raw[0] tells its type ('{', '[', '"', 't', 'f', 'n', or a
	// number's first byte).
	raw []byte
	// members are an object's members, in the body's order (duplicates
	// kept; get takes the last, as encoding/json does).
	members []jsonMember
	// elems are an array's elements.
	elems []jsonValue
	// runes is a string's length in code points as decoded (an invalid
	// UTF-8 byte or lone surrogate counts one, as the U+FFFD it becomes).
	runes int
	// escaped is set for a string with a backslash escape: text decodes
	// it; else its text is raw without the quotes.
	escaped bool
	// compact is the code points of raw without insignificant space, as
	// json.Compact would write it.
	compact int
}

// jsonMember is one member of an object: its key as written (without the
// quotes) and, when the key has an escape, as decoded.
type jsonMember struct {
	keyRaw []byte
	keyEsc string
	value  jsonValue
}

// key is the member's key, decoded.
func (m *jsonMember) key() string {
	if m.keyEsc != "" {
		return m.keyEsc
	}
	return string(m.keyRaw)
}

// is reports whether the member's key is k.
func (m *jsonMember) is(k string) bool {
	if m.keyEsc != "" {
		return m.keyEsc == k
	}
	return string(m.keyRaw) == k
}

// get returns the last member of an object with key k (encoding/json's
// rule for a duplicated key), nil when there is none or v is no object.
func (v *jsonValue) get(k string) *jsonValue {
	if v == nil {
		return nil
	}
	for i := len(v.members) - 1; i >= 0; i-- {
		if v.members[i].is(k) {
			return &v.members[i].value
		}
	}
	return nil
}

// kind is raw[0], 0 for a nil value (absent).
func (v *jsonValue) kind() byte {
	if v == nil || len(v.raw) == 0 {
		return 0
	}
	return v.raw[0]
}

// absent reports whether v is missing or JSON null.
func (v *jsonValue) absent() bool {
	k := v.kind()
	return k == 0 || k == 'n'
}

// typeName names v's JSON type, for error messages (jsonKind).
func (v *jsonValue) typeName() string {
	if v == nil {
		return "nothing"
	}
	return jsonKind(v.raw)
}

// text is a string value's text, decoded as encoding/json decodes it.
func (v *jsonValue) text() string {
	if v.kind() != '"' {
		return ""
	}
	inner := v.raw[1 : len(v.raw)-1]
	if !v.escaped {
		if utf8.Valid(inner) {
			return string(inner)
		}
		return string([]rune(string(inner))) // each invalid byte becomes U+FFFD
	}
	return unquote(inner)
}

// bodyParses counts parseJSON's calls on a whole request body (parseBody):
// a test hook, so a test can tell that each route parses the client's
// bytes once.
var bodyParses atomic.Int64

// maxJSONDepth is encoding/json's nesting limit; a deeper body is invalid.
const maxJSONDepth = 10000

// errJSONSyntax is parseJSON's error; parseBody words it as encoding/json
// does.
var errJSONSyntax = errors.New("invalid JSON")

// parseBody parses a request body that must be one JSON object, once.
// Errors are *requestError with no param, worded as decodeObject words
// them (the body not valid JSON, with encoding/json's own error text; not
// an object; null).
func parseBody(body []byte) (*jsonValue, error) {
	bodyParses.Add(1)
	v, err := parseJSON(body)
	if err != nil {
		// Only an invalid body gets here: encoding/json words the error
		// (its text is part of the answer, and the tests hold it).
		var top map[string]json.RawMessage
		if jerr := json.Unmarshal(body, &top); jerr != nil {
			return nil, &requestError{message: "the request body is not valid JSON: " + jerr.Error()}
		}
		return nil, &requestError{message: "the request body is not valid JSON"}
	}
	switch v.kind() {
	case '{':
		return v, nil
	case 'n':
		return nil, &requestError{message: "the request body must be a JSON object, got null"}
	default:
		return nil, &requestError{message: "the request body must be a JSON object, got " + jsonKind(body)}
	}
}

// parseJSON parses data, which must be exactly one JSON value (RFC 8259,
// as encoding/json reads it: invalid UTF-8 in strings allowed, nesting up
// to maxJSONDepth), in one pass.
//
// Each object's members and each array's elements are gathered on a
// scratch stack (pooled across parses) and copied, when the object or
// array ends, into a slice of exactly their number: one allocation per
// object or array instead of append's doublings.
func parseJSON(data []byte) (*jsonValue, error) {
	st := scratchPool.Get().(*jsonScratch)
	defer st.release()
	p := jsonParser{data: data, st: st}
	p.space()
	v := new(jsonValue)
	if err := p.value(v, 0); err != nil {
		return nil, err
	}
	p.space()
	if p.pos != len(data) {
		return nil, errJSONSyntax
	}
	return v, nil
}

type jsonParser struct {
	data []byte
	pos  int
	// sig counts the code points read so far outside insignificant space
	// (jsonValue.compact).
	sig int
	st  *jsonScratch
}

// jsonScratch holds the members and elements of the objects and arrays
// being parsed, innermost last: an object's members are members[base:]
// while it is read (its nested values push above them and pop before it
// goes on).
type jsonScratch struct {
	members []jsonMember
	elems   []jsonValue
}

var scratchPool = sync.Pool{New: func() any { return new(jsonScratch) }}

// maxScratch is the most members or elements a pooled scratch keeps room
// for; a larger one (an unusual body) is left to the collector.
const maxScratch = 1 << 10

// release empties st (so it holds no body) and returns it to the pool.
func (st *jsonScratch) release() {
	if cap(st.members) > maxScratch || cap(st.elems) > maxScratch {
		return
	}
	clear(st.members[:cap(st.members)])
	clear(st.elems[:cap(st.elems)])
	st.members, st.elems = st.members[:0], st.elems[:0]
	scratchPool.Put(st)
}

func (p *jsonParser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\r', '\n':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value(v *jsonValue, depth int) error {
	if p.pos >= len(p.data) {
		return errJSONSyntax
	}
	start, sig := p.pos, p.sig
	var err error
	switch c := p.data[p.pos]; {
	case c == '{':
		v.members, err = p.object(depth + 1)
	case c == '[':
		v.elems, err = p.array(depth + 1)
	case c == '"':
		v.runes, v.escaped, err = p.str()
	case c == 't':
		err = p.literal("true")
	case c == 'f':
		err = p.literal("false")
	case c == 'n':
		err = p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		err = p.number()
	default:
		err = errJSONSyntax
	}
	if err != nil {
		return err
	}
	v.raw = p.data[start:p.pos]
	v.compact = p.sig - sig
	return nil
}

// object reads an object and returns its members (nil for {}).
func (p *jsonParser) object(depth int) ([]jsonMember, error) {
	if depth > maxJSONDepth {
		return nil, errJSONSyntax
	}
	p.pos++ // '{'
	p.sig++
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		p.sig++
		return nil, nil
	}
	base := len(p.st.members)
	defer func() { p.st.members = p.st.members[:base] }()
	for {
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, errJSONSyntax
		}
		keyStart := p.pos
		_, escaped, err := p.str()
		if err != nil {
			return nil, err
		}
		m := jsonMember{keyRaw: p.data[keyStart+1 : p.pos-1]}
		if escaped {
			m.keyEsc = unquote(m.keyRaw)
		} else if !utf8.Valid(m.keyRaw) {
			m.keyEsc = string([]rune(string(m.keyRaw)))
		}
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, errJSONSyntax
		}
		p.pos++
		p.sig++
		p.space()
		if err := p.value(&m.value, depth); err != nil {
			return nil, err
		}
		p.st.members = append(p.st.members, m)
		p.space()
		if p.pos >= len(p.data) {
			return nil, errJSONSyntax
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.sig++
			p.space()
		case '}':
			p.pos++
			p.sig++
			return slices.Clone(p.st.members[base:]), nil
		default:
			return nil, errJSONSyntax
		}
	}
}

// array reads an array and returns its elements (empty, not nil, for
// []).
func (p *jsonParser) array(depth int) ([]jsonValue, error) {
	if depth > maxJSONDepth {
		return nil, errJSONSyntax
	}
	p.pos++ // '['
	p.sig++
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.sig++
		return []jsonValue{}, nil
	}
	base := len(p.st.elems)
	defer func() { p.st.elems = p.st.elems[:base] }()
	for {
		var e jsonValue
		if err := p.value(&e, depth); err != nil {
			return nil, err
		}
		p.st.elems = append(p.st.elems, e)
		p.space()
		if p.pos >= len(p.data) {
			return nil, errJSONSyntax
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
			p.sig++
			p.space()
		case ']':
			p.pos++
			p.sig++
			return slices.Clone(p.st.elems[base:]), nil
		default:
			return nil, errJSONSyntax
		}
	}
}

// str reads a string token: its decoded length in code points, whether it
// has an escape.
func (p *jsonParser) str() (runes int, escaped bool, err error) {
	d := p.data
	i := p.pos + 1
	written := 1 // the code points of the token as written, quotes included
	for i < len(d) {
		c := d[i]
		switch {
		case c == '"':
			p.pos = i + 1
			p.sig += written + 1
			return runes, escaped, nil
		case c < 0x20:
			return 0, false, errJSONSyntax
		case c == '\\':
			escaped = true
			if i+1 >= len(d) {
				return 0, false, errJSONSyntax
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
				written += 2
				runes++
			case 'u':
				r, ok := hex4(d, i+2)
				if !ok {
					return 0, false, errJSONSyntax
				}
				i += 6
				written += 6
				runes++
				if utf16.IsSurrogate(r) {
					// A pair is one code point; a lone surrogate is U+FFFD.
					if r2, ok := hex4(d, i+2); ok && i+1 < len(d) && d[i] == '\\' && d[i+1] == 'u' &&
						utf16.DecodeRune(r, r2) != utf8.RuneError {
						i += 6
						written += 6
					}
				}
			default:
				return 0, false, errJSONSyntax
			}
		case c < utf8.RuneSelf:
			i++
			written++
			runes++
		default:
			_, size := utf8.DecodeRune(d[i:])
			i += size
			written++
			runes++
		}
	}
	return 0, false, errJSONSyntax
}

// hex4 reads the four hex digits of a \u escape at d[i:].
func hex4(d []byte, i int) (rune, bool) {
	if i+4 > len(d) {
		return 0, false
	}
	var r rune
	for _, c := range d[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r*16 + rune(c)
	}
	return r, true
}

// unquote decodes the inside of a valid JSON string token as encoding/json
// does: escapes, surrogate pairs, and U+FFFD for a lone surrogate or an
// invalid UTF-8 byte.
func unquote(s []byte) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			switch s[i+1] {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, _ := hex4(s, i+2)
				i += 6
				if utf16.IsSurrogate(r) {
					r2, ok := hex4(s, i+2)
					if ok && i+1 < len(s) && s[i] == '\\' && s[i+1] == 'u' {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							i += 6
							continue
						}
					}
					r = utf8.RuneError
				}
				out = utf8.AppendRune(out, r)
				continue
			default: // '"', '\\', '/'
				out = append(out, s[i+1])
			}
			i += 2
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, s[i:i+size]...)
			}
			i += size
		}
	}
	return string(out)
}

func (p *jsonParser) literal(lit string) error {
	if len(p.data)-p.pos < len(lit) || string(p.data[p.pos:p.pos+len(lit)]) != lit {
		return errJSONSyntax
	}
	p.pos += len(lit)
	p.sig += len(lit)
	return nil
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (p *jsonParser) number() error {
	d, i := p.data, p.pos
	digits := func() int {
		n := 0
		for i < len(d) && d[i] >= '0' && d[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case digits() == 0:
		return errJSONSyntax
	}
	if i < len(d) && d[i] == '.' {
		i++
		if digits() == 0 {
			return errJSONSyntax
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if digits() == 0 {
			return errJSONSyntax
		}
	}
	p.sig += i - p.pos
	p.pos = i
	return nil
}
