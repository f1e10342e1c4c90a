package request

import "unicode/utf8"

// MaxQuotedBytes bounds one client value quoted in an error message or a
// log line (Clip): a model name, a URL path, a field's value. So a 1 MB
// model name does not make a 1 MB error body or log line.
const MaxQuotedBytes = 256

// Clip returns s cut to at most MaxQuotedBytes bytes of valid UTF-8,
// ending in "…" when it was cut; invalid bytes become U+FFFD.
func Clip(s string) string { return ClipTo(s, MaxQuotedBytes) }

// ClipTo is Clip with a bound of limit bytes (at least len("…")).
func ClipTo(s string, limit int) string {
	if len(s) <= limit && utf8.ValidString(s) {
		return s
	}
	const ellipsis = "…"
	out := make([]byte, 0, limit)
	cut := 0 // the longest rune-aligned prefix of out that leaves room for the ellipsis
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:]) // an invalid byte is (RuneError, 1)
		if len(out)+utf8.RuneLen(r) > limit {
			return string(out[:cut]) + ellipsis
		}
		out = utf8.AppendRune(out, r)
		if len(out) <= limit-len(ellipsis) {
			cut = len(out)
		}
		i += size
	}
	return string(out)
}
