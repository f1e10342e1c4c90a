package request

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// TestClip: a client value quoted in a message is cut to MaxQuotedBytes
// of valid UTF-8, ending in "…" when cut.
func TestClip(t *testing.T) {
	const ell = "…"
	tests := []struct {
		name, in, want string
	}{
		{"empty", "", ""},
		{"short", "llama3", "llama3"},
		{"exactly the limit", strings.Repeat("a", 256), strings.Repeat("a", 256)},
		{"one over", strings.Repeat("a", 257), strings.Repeat("a", 253) + ell},
		{"2-byte runes", strings.Repeat("é", 200), strings.Repeat("é", 126) + ell},
		{"3-byte runes", strings.Repeat("日", 100), strings.Repeat("日", 84) + ell},
		{"4-byte rune at the cut", strings.Repeat("a", 251) + "😀😀", strings.Repeat("a", 251) + ell},
		{"invalid UTF-8, short", "a\xffb", "a\uFFFDb"},
		{"invalid UTF-8 grows past the limit", strings.Repeat("\xff", 100), strings.Repeat("\uFFFD", 84) + ell},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Clip(tt.in)
			if got != tt.want {
				t.Errorf("clip = %q (%d bytes), want %q", got, len(got), tt.want)
			}
			if len(got) > MaxQuotedBytes || !utf8.ValidString(got) {
				t.Errorf("clip = %d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
			}
		})
	}
}
