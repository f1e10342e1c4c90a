package adapter

import (
	"bytes"
	"encoding/json"
	"html"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The parts of an HTML page bodyText reads: comments, scripts and styles
// (with their content) are dropped, the title and headings looked for,
// every other tag dropped.
var (
	htmlComment = regexp.MustCompile(`(?s)<!--.*?-->`)
	htmlBlock   = regexp.MustCompile(`(?is)<(script|style)\b.*?</(script|style)\s*>`)
	htmlTitle   = regexp.MustCompile(`(?is)<title\b[^>]*>(.*?)</title\s*>`)
	htmlHeading = regexp.MustCompile(`(?is)<h[1-6]\b[^>]*>(.*?)</h[1-6]\s*>`)
	htmlTag     = regexp.MustCompile(`(?s)<[^>]*>`)
)

// bodyText is the text of an error body that is not JSON, for a message
// to show: a plain-text answer ("Bad Gateway", an Envoy "upstream connect
// error ...") as it is; an HTML page (a body that begins with '<') by its
// title, else its first heading, else its text without comments,
// scripts, styles and tags, entities decoded (a page's footer, such as a
// proxy's software signature, is not its message). Every run of white
// space becomes one space, control characters are dropped and invalid
// UTF-8 becomes U+FFFD. It is "" for a body that is or begins like JSON
// ('{' or '[': a truncated JSON error is no message) or holds no text.
// The result is not redacted nor cut: the caller does both.
func bodyText(data []byte) string {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] == '{' || data[0] == '[' || json.Valid(data) {
		return ""
	}
	text := string(data)
	if data[0] != '<' {
		return collapseSpace(text)
	}
	text = htmlComment.ReplaceAllString(text, " ")
	text = htmlBlock.ReplaceAllString(text, " ")
	for _, re := range []*regexp.Regexp{htmlTitle, htmlHeading} {
		if m := re.FindStringSubmatch(text); m != nil {
			if t := htmlText(m[1]); t != "" {
				return t
			}
		}
	}
	return htmlText(text)
}

// htmlText is the text of an HTML fragment: its tags dropped, its
// entities decoded, its white space collapsed.
func htmlText(fragment string) string {
	return collapseSpace(html.UnescapeString(htmlTag.ReplaceAllString(fragment, " ")))
}

// collapseSpace makes every run of white space in s one space, drops other
// control characters and replaces invalid UTF-8 with U+FFFD; the result is
// trimmed.
func collapseSpace(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	space := false
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case unicode.IsSpace(r):
			space = true
			continue
		case unicode.IsControl(r):
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r) // an invalid byte is RuneError: U+FFFD
	}
	return b.String()
}
