package adapter

import "testing"

// A plain-text error body keeps its text, an HTML page its title (else
// its first heading, else its text): no markup, no footer; white space
// collapses; a JSON body, or one that begins like JSON, has no body text
// (its fields say the message).
func TestBodyText(t *testing.T) {
	for body, want := range map[string]string{
		"Bad Gateway\n": "Bad Gateway",
		"  upstream\tconnect error or disconnect/reset before headers. reset reason: connection failure  ":                                                                                           "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
		"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n":                "502 Bad Gateway",
		"<!DOCTYPE html><html><head><title>Error</title><style>body{color:red}</style><script>var x = '<b>';</script></head><body><!-- hidden --><p>Service &amp; API unavailable</p></body></html>": "Error",
		"<html><body><h2>Service &amp; API</h2> unavailable</body></html>":                                                                                                                           "Service & API",
		"<div>Service <b>down</b></div>": "Service down",
		`{"error":{"message":"trunc`:     "",
		"<p>no title</p>":                "no title",
		"a\x00b\x1bc \xff":               "abc \uFFFD",
		`{"error":"json"}`:               "",
		`"a JSON string"`:                "",
		"":                               "",
		"   \n ":                         "",
		"<html><body></body></html>":     "",
	} {
		if got := bodyText([]byte(body)); got != want {
			t.Errorf("bodyText(%q) = %q, want %q", body, got, want)
		}
	}
}
