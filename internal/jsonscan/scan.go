// Package jsonscan reads JSON bodies in place: it checks that a body is
// what json.Valid accepts and reports the spans of the members a caller
// asks about, without decoding the document or allocating. The node's
// model rewrite and the edge's prompt blocks rest on it, so a body of
// 100 KiB is walked once instead of being decoded into Go values.
//
// A span is a byte range [start, end) of the body. A string is reported
// with its quotes and flags (Escaped, High): a string with neither is its
// own value; one with them is decoded by AppendString or KeyIs.
package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is how deep arrays and objects may nest, as encoding/json's
// scanner allows: json.Valid rejects a deeper body.
const MaxDepth = 10000

// String flags String reports.
const (
	Escaped = 1 << iota // has a backslash escape
	High                // has a byte ≥ 0x80 (maybe not valid UTF-8)
)

// Object reports whether body is one JSON object: what json.Valid
// accepts, with a '{' as its first byte past white space. It calls member
// for each top-level member, in order, with its key (quotes included, and
// String's flags for it) and the span of its value in body; open is the
// index just after the object's '{', members how many it has. It does not
// allocate (member does not escape). A key or value with an escape, or
// with bytes that are not valid UTF-8, is for member to decode (KeyIs,
// AppendString).
func Object(body []byte, member func(key []byte, keyFlags int, vstart, vend int)) (open, members int, ok bool) {
	i := SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return 0, 0, false
	}
	open = i + 1
	end, members := Members(body, i, 1, member)
	return open, members, end >= 0 && SkipSpace(body, end) == len(body)
}

// Members walks the object that opens at body[i] ('{'), nested depth deep
// (the top-level object is 1), calling member for each of its members as
// Object does; end is the index just past its '}', -1 if it is not a
// valid object.
func Members(body []byte, i, depth int, member func(key []byte, keyFlags int, vstart, vend int)) (end, members int) {
	return MembersFunc(body, i, depth, func(key []byte, keyFlags int, vstart int) int {
		vend := Value(body, vstart, depth)
		if vend >= 0 {
			member(key, keyFlags, vstart, vend)
		}
		return vend
	})
}

// MembersFunc is Members for a caller that reads some values itself: for
// each member, value is called with its key (as for Members) and the index
// where its value starts (white space skipped), and returns the index just
// past the value, -1 when it is not valid (the walk then fails). value
// may call Value for the members it leaves alone; a value it reads itself
// is checked by it alone, so it must reject what Value rejects.
func MembersFunc(body []byte, i, depth int, value func(key []byte, keyFlags int, vstart int) (vend int)) (end, members int) {
	if i >= len(body) || body[i] != '{' || depth > MaxDepth {
		return -1, 0
	}
	i = SkipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return i + 1, 0
	}
	for {
		if i >= len(body) || body[i] != '"' {
			return -1, members
		}
		kend, kflags := String(body, i)
		if kend < 0 {
			return -1, members
		}
		key := body[i:kend]
		i = SkipSpace(body, kend)
		if i >= len(body) || body[i] != ':' {
			return -1, members
		}
		vstart := SkipSpace(body, i+1)
		if vstart >= len(body) {
			return -1, members
		}
		vend := value(key, kflags, vstart)
		if vend < 0 {
			return -1, members
		}
		members++
		i = SkipSpace(body, vend)
		if i >= len(body) {
			return -1, members
		}
		switch body[i] {
		case ',':
			i = SkipSpace(body, i+1)
		case '}':
			return i + 1, members
		default:
			return -1, members
		}
	}
}

// Elements walks the array that opens at body[i] ('['), nested depth deep,
// calling element with the span of each element; end is the index just
// past its ']', -1 if it is not a valid array.
func Elements(body []byte, i, depth int, element func(vstart, vend int)) (end int) {
	if i >= len(body) || body[i] != '[' || depth+1 > MaxDepth {
		return -1
	}
	i = SkipSpace(body, i+1)
	if i < len(body) && body[i] == ']' {
		return i + 1
	}
	for {
		vend := Value(body, i, depth+1)
		if vend < 0 {
			return -1
		}
		element(i, vend)
		if i = SkipSpace(body, vend); i >= len(body) {
			return -1
		}
		switch body[i] {
		case ',':
			i = SkipSpace(body, i+1)
		case ']':
			return i + 1
		default:
			return -1
		}
	}
}

// String returns the index just past the JSON string that opens at
// body[start] ('"'), and whether it has escapes or non-ASCII bytes; -1 if
// it is not a valid string (an unknown escape, a short \u, a control byte,
// no closing quote). Bytes ≥ 0x80 are not checked: json.Valid does not
// check UTF-8 either.
func String(body []byte, start int) (end int, flags int) {
	for i := start + 1; i < len(body); i++ {
		if i = Plain(body, i); i >= len(body) {
			break
		}
		switch c := body[i]; {
		case c == '"':
			return i + 1, flags
		case c == '\\':
			flags |= Escaped
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
		default: // c >= utf8.RuneSelf
			flags |= High
		}
	}
	return -1, flags
}

// Plain returns the index of the first byte at or after i that a JSON
// string's reader must look at (a quote, a backslash, a control byte or a
// byte ≥ 0x80), len(body) if there is none: the run of bytes that stand
// for themselves, read eight at a time.
func Plain(body []byte, i int) int {
	for i+8 <= len(body) && plain8(binary.LittleEndian.Uint64(body[i:])) {
		i += 8
	}
	for i < len(body) && plain[body[i]] {
		i++
	}
	return i
}

// plain marks the bytes String passes over without a second look: not a
// quote, a backslash, a control byte or a byte ≥ 0x80.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// Eight bytes at a time (SWAR): lo has 1 in each byte, hi the top bit of
// each.
const (
	lo = 0x0101010101010101
	hi = 0x8080808080808080
)

// plain8 reports whether every byte of x is plain: below 0x80, at least
// 0x20, neither '"' nor '\\'.
func plain8(x uint64) bool {
	return x&hi == 0 && (x-lo*0x20)&^x&hi == 0 && hasZero(x^(lo*'"')) == 0 && hasZero(x^(lo*'\\')) == 0
}

// hasZero is nonzero when a byte of v is zero.
func hasZero(v uint64) uint64 { return (v - lo) &^ v & hi }

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// KeyIs reports whether the JSON string quoted (quotes included, as
// String found it, with its flags) decodes to name.
func KeyIs(quoted []byte, flags int, name string) bool {
	if flags == 0 {
		return string(quoted[1:len(quoted)-1]) == name
	}
	return decodesTo(quoted, flags, name)
}

// StringIs reports whether the JSON value v decodes to the string name.
func StringIs(v []byte, name string) bool {
	if len(v) == 0 || v[0] != '"' {
		return false
	}
	_, flags := String(v, 0)
	return KeyIs(v, flags, name)
}

// decodesTo decodes the valid JSON string quoted and compares it with
// name: the slow path for escapes and non-ASCII bytes (encoding/json
// replaces invalid UTF-8 with U+FFFD, so raw bytes may differ from what
// they decode to).
func decodesTo(quoted []byte, flags int, name string) bool {
	if flags == High && utf8.Valid(quoted) {
		return string(quoted[1:len(quoted)-1]) == name
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == name
}

// Decode hands the value of the valid JSON string quoted (quotes
// included, as String found it) to emit, piece by piece, as encoding/json
// decodes it: the escapes resolved, a \u escape that is half of a
// surrogate pair without its other half and every byte that is not valid
// UTF-8 as U+FFFD. The pieces are quoted's own bytes where it has no
// escape, so a long string goes to emit without being copied; emit must
// neither keep nor modify them. It allocates only for a \u escape of a
// non-ASCII rune (once a call).
func Decode(quoted []byte, emit func([]byte)) {
	s := quoted[1 : len(quoted)-1]
	var runes []byte // a \u escape's non-ASCII rune, allocated when there is one
	emitRune := func(r rune) {
		if r < utf8.RuneSelf {
			emit(ascii[r : r+1])
			return
		}
		if runes == nil {
			runes = make([]byte, 0, utf8.UTFMax)
		}
		runes = utf8.AppendRune(runes[:0], r)
		emit(runes)
	}
	for len(s) > 0 {
		// The bytes up to the next escape, whole when valid UTF-8.
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			i = len(s)
		}
		if seg := s[:i]; utf8.Valid(seg) {
			if len(seg) > 0 {
				emit(seg)
			}
		} else {
			emitInvalid(seg, emit)
		}
		s = s[i:]
		if len(s) == 0 {
			break
		}
		// An escape: String checked its form.
		var c byte
		switch s[1] {
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		case 'u':
			r := hex4(s[2:6])
			s = s[6:]
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
					r2 = hex4(s[2:6])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					emitRune(dec)
					s = s[6:]
					continue
				}
				r = utf8.RuneError
			}
			emitRune(r)
			continue
		default: // '"', '\\', '/'
			c = s[1]
		}
		emit(ascii[c : c+1])
		s = s[2:]
	}
}

// ascii holds each ASCII byte, for Decode to hand on an escaped one
// without allocating.
var ascii = func() (t [utf8.RuneSelf]byte) {
	for i := range t {
		t[i] = byte(i)
	}
	return t
}()

// replacement is U+FFFD in UTF-8.
var replacement = []byte(string(utf8.RuneError))

// emitInvalid is Decode of a run without escapes that is not valid UTF-8:
// its valid runs as they are, each invalid byte as U+FFFD.
func emitInvalid(seg []byte, emit func([]byte)) {
	start := 0
	for i := 0; i < len(seg); {
		r, size := utf8.DecodeRune(seg[i:])
		if r == utf8.RuneError && size == 1 {
			if start < i {
				emit(seg[start:i])
			}
			emit(replacement)
			i++
			start = i
			continue
		}
		i += size
	}
	if start < len(seg) {
		emit(seg[start:])
	}
}

// AppendString appends the value of the valid JSON string quoted to dst,
// as Decode hands it on.
func AppendString(dst, quoted []byte) []byte {
	Decode(quoted, func(p []byte) { dst = append(dst, p...) })
	return dst
}

// hex4 is the value of four hex digits.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		default:
			c = c - 'A' + 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// Value returns the index just past the JSON value that starts at body[i]
// (white space before it already skipped), nested depth deep (the
// top-level object is 1); -1 if there is no valid value there.
func Value(body []byte, i, depth int) int {
	if i >= len(body) {
		return -1
	}
	switch c := body[i]; {
	case c == '"':
		end, _ := String(body, i)
		return end
	case c == '{':
		end, _ := Members(body, i, depth+1, func([]byte, int, int, int) {})
		return end
	case c == '[':
		return Elements(body, i, depth, func(int, int) {})
	case c == '-' || '0' <= c && c <= '9':
		return Number(body, i)
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

// Number returns the index just past the JSON number at body[i]
// (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), -1 if there is none.
func Number(body []byte, i int) int {
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

// SkipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func SkipSpace(body []byte, i int) int {
	for i < len(body) && (body[i] == ' ' || body[i] == '\t' || body[i] == '\r' || body[i] == '\n') {
		i++
	}
	return i
}
