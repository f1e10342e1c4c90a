package adapter

import (
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// TestRedactEqualsReplace: redact, which skips the Replacer for a string
// holding neither the host, the password nor the key, gives what the
// Replacer gives, for any provider URL (with or without a password), key
// and string made of pieces of them and other text.
func TestRedactEqualsReplace(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		word := rapid.StringMatching(`[a-z0-9.:]{1,8}`)
		host := word.Draw(t, "host")
		pw := rapid.SampledFrom([]string{"", "pw", "s3cret", host}).Draw(t, "password")
		key := rapid.SampledFrom([]string{"", "sk-key", "k", "pw"}).Draw(t, "key")
		base := "http://" + host + "/v1"
		if pw != "" {
			base = "https://user:" + pw + "@" + host + "/v1"
		}
		p, err := newHTTPProvider(Config{BaseURL: base, APIKey: key})
		if err != nil {
			t.Skip(err)
		}
		pieces := []string{host, pw, key, base, "http://", "https://", "Bearer ", "/v1", " ", "{\"error\":\"", "x"}
		var b strings.Builder
		for range rapid.IntRange(0, 8).Draw(t, "pieces") {
			piece := rapid.SampledFrom(pieces).Draw(t, "piece")
			if n := len(piece); n > 0 && rapid.Bool().Draw(t, "cut") {
				piece = piece[:rapid.IntRange(0, n).Draw(t, "at")]
			}
			b.WriteString(piece)
		}
		s := b.String()
		if got, want := p.redact(s), p.redactor.Replace(s); got != want {
			t.Fatalf("redact(%q) = %q, want %q (base %q, key %q)", s, got, want, base, key)
		}
	})
}
