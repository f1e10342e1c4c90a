// Package jsonvalue reads one JSON document in one pass into a tree of
// values that point into its bytes: each value's raw span, an object's
// members (duplicates kept, in order), an array's elements, a string's
// length in code points, and each value's length as json.Compact would
// write it. It accepts exactly what encoding/json accepts. The edge's
// request decoders check a client's body on it without decoding any part
// of it twice.
package jsonvalue

import (
	"errors"
	"slices"
	"sync"
	"unicode/utf16"
	"unicode/utf8"

	"iop/internal/jsonscan"
)

// Value is one JSON value of a document as Parse read it. A nil *Value
// is absent (a member or element that is not there).
type Value struct {
	// Raw is the value's bytes, a subslice of the document, without the
	// space around it; Raw[0] tells its type ('{', '[', '"', 't', 'f',
	// 'n', or a number's first byte).
	Raw []byte
	// Members are an object's members, in the document's order
	// (duplicates kept; Get takes the last, as encoding/json does).
	Members []Member
	// Elems are an array's elements.
	Elems []Value
	// Runes is a string's length in code points as decoded (an invalid
	// UTF-8 byte or lone surrogate counts one, as the U+FFFD it becomes).
	Runes int
	// Compact is the code points of Raw without insignificant space, as
	// json.Compact would write it.
	Compact int
	// escaped is set for a string with a backslash escape: Text decodes
	// it; else its text is Raw without the quotes.
	escaped bool
}

// Member is one member of an object: its key as written (without the
// quotes) and, when the key has an escape, as decoded; and its value.
type Member struct {
	keyRaw []byte
	keyEsc string
	Value  Value
}

// Key is the member's key, decoded.
func (m *Member) Key() string {
	if m.keyEsc != "" {
		return m.keyEsc
	}
	return string(m.keyRaw)
}

// Is reports whether the member's key is k.
func (m *Member) Is(k string) bool {
	if m.keyEsc != "" {
		return m.keyEsc == k
	}
	return string(m.keyRaw) == k
}

// Get returns the last member of an object with key k (encoding/json's
// rule for a duplicated key), nil when there is none or v is no object.
func (v *Value) Get(k string) *Value {
	if v == nil {
		return nil
	}
	for i := len(v.Members) - 1; i >= 0; i-- {
		if v.Members[i].Is(k) {
			return &v.Members[i].Value
		}
	}
	return nil
}

// Kind is Raw[0], 0 for a nil value (absent).
func (v *Value) Kind() byte {
	if v == nil || len(v.Raw) == 0 {
		return 0
	}
	return v.Raw[0]
}

// Absent reports whether v is missing or JSON null.
func (v *Value) Absent() bool {
	k := v.Kind()
	return k == 0 || k == 'n'
}

// TypeName names v's JSON type, for error messages (KindName).
func (v *Value) TypeName() string { return KindName(v.Kind()) }

// KindName names the JSON type of a value whose first byte is b: "a
// string", "an object", "an array", "a boolean", "null", "a number", or
// "nothing" for 0.
func KindName(b byte) string {
	switch b {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	case 0:
		return "nothing"
	default:
		return "a number"
	}
}

// Text is a string value's text, decoded as encoding/json decodes it; ""
// for any other value.
func (v *Value) Text() string {
	if v.Kind() != '"' {
		return ""
	}
	inner := v.Raw[1 : len(v.Raw)-1]
	if !v.escaped {
		if utf8.Valid(inner) {
			return string(inner)
		}
		return string([]rune(string(inner))) // each invalid byte becomes U+FFFD
	}
	return unquote(inner)
}

// MaxDepth is encoding/json's nesting limit; a deeper document is
// invalid.
const MaxDepth = 10000

// ErrSyntax is Parse's error: data is not exactly one JSON value.
var ErrSyntax = errors.New("invalid JSON")

// Parse parses data, which must be exactly one JSON value (RFC 8259,
// as encoding/json reads it: invalid UTF-8 in strings allowed, nesting up
// to MaxDepth), in one pass.
//
// Each object's members and each array's elements are gathered on a
// scratch stack (pooled across parses) and copied, when the object or
// array ends, into a slice of exactly their number: one allocation per
// object or array instead of append's doublings.
func Parse(data []byte) (*Value, error) {
	st := scratchPool.Get().(*scratch)
	defer st.release()
	p := parser{data: data, st: st}
	p.space()
	v := new(Value)
	if err := p.value(v, 0); err != nil {
		return nil, err
	}
	p.space()
	if p.pos != len(data) {
		return nil, ErrSyntax
	}
	return v, nil
}

type parser struct {
	data []byte
	pos  int
	// sig counts the code points read so far outside insignificant space
	// (Value.Compact).
	sig int
	st  *scratch
}

// scratch holds the members and elements of the objects and arrays
// being parsed, innermost last: an object's members are members[base:]
// while it is read (its nested values push above them and pop before it
// goes on).
type scratch struct {
	members []Member
	elems   []Value
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// maxScratch is the most members or elements a pooled scratch keeps room
// for; a larger one (an unusual body) is left to the collector.
const maxScratch = 1 << 10

// release empties st (so it holds no body) and returns it to the pool.
func (st *scratch) release() {
	if cap(st.members) > maxScratch || cap(st.elems) > maxScratch {
		return
	}
	clear(st.members[:cap(st.members)])
	clear(st.elems[:cap(st.elems)])
	st.members, st.elems = st.members[:0], st.elems[:0]
	scratchPool.Put(st)
}

func (p *parser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\r', '\n':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(v *Value, depth int) error {
	if p.pos >= len(p.data) {
		return ErrSyntax
	}
	start, sig := p.pos, p.sig
	var err error
	switch c := p.data[p.pos]; {
	case c == '{':
		v.Members, err = p.object(depth + 1)
	case c == '[':
		v.Elems, err = p.array(depth + 1)
	case c == '"':
		v.Runes, v.escaped, err = p.str()
	case c == 't':
		err = p.literal("true")
	case c == 'f':
		err = p.literal("false")
	case c == 'n':
		err = p.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		err = p.number()
	default:
		err = ErrSyntax
	}
	if err != nil {
		return err
	}
	v.Raw = p.data[start:p.pos]
	v.Compact = p.sig - sig
	return nil
}

// object reads an object and returns its members (nil for {}).
func (p *parser) object(depth int) ([]Member, error) {
	if depth > MaxDepth {
		return nil, ErrSyntax
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
			return nil, ErrSyntax
		}
		keyStart := p.pos
		_, escaped, err := p.str()
		if err != nil {
			return nil, err
		}
		m := Member{keyRaw: p.data[keyStart+1 : p.pos-1]}
		if escaped {
			m.keyEsc = unquote(m.keyRaw)
		} else if !utf8.Valid(m.keyRaw) {
			m.keyEsc = string([]rune(string(m.keyRaw)))
		}
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, ErrSyntax
		}
		p.pos++
		p.sig++
		p.space()
		if err := p.value(&m.Value, depth); err != nil {
			return nil, err
		}
		p.st.members = append(p.st.members, m)
		p.space()
		if p.pos >= len(p.data) {
			return nil, ErrSyntax
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
			return nil, ErrSyntax
		}
	}
}

// array reads an array and returns its elements (empty, not nil, for
// []).
func (p *parser) array(depth int) ([]Value, error) {
	if depth > MaxDepth {
		return nil, ErrSyntax
	}
	p.pos++ // '['
	p.sig++
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		p.sig++
		return []Value{}, nil
	}
	base := len(p.st.elems)
	defer func() { p.st.elems = p.st.elems[:base] }()
	for {
		var e Value
		if err := p.value(&e, depth); err != nil {
			return nil, err
		}
		p.st.elems = append(p.st.elems, e)
		p.space()
		if p.pos >= len(p.data) {
			return nil, ErrSyntax
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
			return nil, ErrSyntax
		}
	}
}

// str reads a string token: its decoded length in code points, whether it
// has an escape.
func (p *parser) str() (runes int, escaped bool, err error) {
	d := p.data
	i := p.pos + 1
	written := 1 // the code points of the token as written, quotes included
	for i < len(d) {
		// A byte that stands for itself is one code point as written and
		// one decoded.
		if j := jsonscan.Plain(d, i); j > i {
			written, runes, i = written+j-i, runes+j-i, j
			if i >= len(d) {
				break
			}
		}
		c := d[i]
		switch {
		case c == '"':
			p.pos = i + 1
			p.sig += written + 1
			return runes, escaped, nil
		case c < 0x20:
			return 0, false, ErrSyntax
		case c == '\\':
			escaped = true
			if i+1 >= len(d) {
				return 0, false, ErrSyntax
			}
			switch d[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
				written += 2
				runes++
			case 'u':
				r, ok := hex4(d, i+2)
				if !ok {
					return 0, false, ErrSyntax
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
				return 0, false, ErrSyntax
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
	return 0, false, ErrSyntax
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

func (p *parser) literal(lit string) error {
	if len(p.data)-p.pos < len(lit) || string(p.data[p.pos:p.pos+len(lit)]) != lit {
		return ErrSyntax
	}
	p.pos += len(lit)
	p.sig += len(lit)
	return nil
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (p *parser) number() error {
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
		return ErrSyntax
	}
	if i < len(d) && d[i] == '.' {
		i++
		if digits() == 0 {
			return ErrSyntax
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if digits() == 0 {
			return ErrSyntax
		}
	}
	p.sig += i - p.pos
	p.pos = i
	return nil
}
