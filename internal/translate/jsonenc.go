package translate

import (
	"encoding/binary"
	"errors"
	"unicode/utf8"

	"iop/internal/jsonscan"
)

// This file writes JSON as json.Marshal writes it, byte for byte (HTML
// characters escaped, invalid UTF-8 as \ufffd, RawMessage compacted), for
// the encoders of the Ollama request bodies (appendJSON): a string the
// client sent already in that form is copied as it is instead of being
// decoded and escaped again.

// errInvalidRaw is a json.RawMessage that is not one JSON value (json.Marshal
// refuses it too).
var errInvalidRaw = errors.New("translate: raw JSON value is not valid JSON")

const hexDigits = "0123456789abcdef"

// htmlSafe marks the ASCII bytes json.Marshal writes as they are in a
// string: not a control byte, a quote, a backslash, '<', '>' or '&'.
var htmlSafe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// appendJSONString appends s as json.Marshal writes a string (quotes
// included).
func appendJSONString[S []byte | string](dst []byte, s S) []byte {
	dst = append(dst, '"')
	dst = appendEscaped(dst, s)
	return append(dst, '"')
}

// appendEscaped appends s as json.Marshal writes the inside of a string
// (encoding/json's appendString with HTML escaping).
func appendEscaped[S []byte | string](dst []byte, s S) []byte {
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if htmlSafe[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '\\', '"':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(dst, s[start:]...)
}

func decodeRune[S []byte | string](s S) (rune, int) {
	n := min(len(s), utf8.UTFMax)
	var b [utf8.UTFMax]byte
	copy(b[:], s[:n])
	return utf8.DecodeRune(b[:n])
}

// appendRawString appends the valid JSON string quoted (quotes included,
// as jsonscan.String found it) as json.Marshal writes the string it
// decodes to: quoted itself when it is already in that form (canonical),
// else its value decoded (jsonscan.Decode) and escaped again.
func appendRawString(dst, quoted []byte) []byte {
	if canonical(quoted) {
		return append(dst, quoted...)
	}
	dst = append(dst, '"')
	jsonscan.Decode(quoted, func(p []byte) { dst = appendEscaped(dst, p) })
	return append(dst, '"')
}

// canonical reports whether the valid JSON string quoted is written as
// json.Marshal writes its value: every ASCII byte one it leaves as it is,
// every escape one it writes (\" \\ \b \f \n \r \t, \u00xx for the other
// control bytes, \u003c \u003e \u0026 \u2028 \u2029, hex digits in lower
// case), every other byte part of valid UTF-8 other than U+2028 and
// U+2029.
func canonical(quoted []byte) bool {
	s := quoted[1 : len(quoted)-1]
	for i := 0; i < len(s); {
		for i+8 <= len(s) && htmlSafe8(binary.LittleEndian.Uint64(s[i:])) {
			i += 8
		}
		if i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if htmlSafe[c] {
				i++
				continue
			}
			if c != '\\' {
				return false // '<', '>', '&' (a quote or a control byte cannot be here)
			}
			switch s[i+1] {
			case '"', '\\', 'b', 'f', 'n', 'r', 't':
				i += 2
				continue
			case 'u':
				if !canonicalU(s[i+2 : i+6]) {
					return false
				}
				i += 6
				continue
			}
			return false // \/
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return false
		}
		i += size
	}
	return true
}

// Eight bytes at a time (SWAR): lo8 has 1 in each byte, hi8 the top bit
// of each.
const (
	lo8 = 0x0101010101010101
	hi8 = 0x8080808080808080
)

// htmlSafe8 reports whether each byte of x is htmlSafe.
func htmlSafe8(x uint64) bool {
	return x&hi8 == 0 && (x-lo8*0x20)&^x&hi8 == 0 &&
		hasZero(x^(lo8*'"')) == 0 && hasZero(x^(lo8*'\\')) == 0 &&
		hasZero(x^(lo8*'<')) == 0 && hasZero(x^(lo8*'>')) == 0 && hasZero(x^(lo8*'&')) == 0
}

// hasZero is nonzero when a byte of v is zero.
func hasZero(v uint64) uint64 { return (v - lo8) &^ v & hi8 }

// canonicalU reports whether the four hex digits of a \u escape are one
// json.Marshal writes.
func canonicalU(h []byte) bool {
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	switch string(h) {
	case "003c", "003e", "0026", "2028", "2029":
		return true
	}
	if h[0] != '0' || h[1] != '0' || h[2] > '1' {
		return false
	}
	switch string(h[2:]) {
	case "08", "0c", "0a", "0d", "09":
		return false // \b \f \n \r \t
	}
	return true
}

// appendCompactRaw appends raw as json.Marshal writes a json.RawMessage:
// compacted (no white space between tokens), '<', '>', '&', U+2028 and
// U+2029 escaped; errInvalidRaw when raw is not one JSON value.
func appendCompactRaw(dst, raw []byte) ([]byte, error) {
	i, end, ok := validJSON(raw)
	if !ok {
		return dst, errInvalidRaw
	}
	raw = raw[i:end]
	start := 0
	inString := false
	for j := 0; j < len(raw); j++ {
		c := raw[j]
		switch {
		case inString && c == '\\':
			j++ // the escaped byte: never a quote that ends the string
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			dst = append(dst, raw[start:j]...)
			start = j + 1
		case c == '<' || c == '>' || c == '&':
			dst = append(dst, raw[start:j]...)
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			start = j + 1
		case c == 0xE2 && j+2 < len(raw) && raw[j+1] == 0x80 && raw[j+2]&^1 == 0xA8:
			dst = append(dst, raw[start:j]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[raw[j+2]&0xF])
			j += 2
			start = j + 1
		}
	}
	return append(dst, raw[start:]...), nil
}

// validJSON reports whether raw is what json.Valid accepts, and where its
// one value starts and ends.
func validJSON(raw []byte) (start, end int, ok bool) {
	start = jsonscan.SkipSpace(raw, 0)
	end = jsonscan.Value(raw, start, 0)
	return start, end, end >= 0 && jsonscan.SkipSpace(raw, end) == len(raw)
}
