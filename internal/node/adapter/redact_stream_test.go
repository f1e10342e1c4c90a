package adapter

import (
	"strings"
	"testing"
)

// TestRegression_TunnelRelaysEchoedProviderKey: a provider that echoed its
// API key inside a 200 SSE stream (`data: {"error":{"message":"key
// Bearer sk-... was revoked"}}`) had it relayed to the client byte for
// byte. The relayed body must have it replaced, wherever chunk boundaries fall.
func TestRegression_TunnelRelaysEchoedProviderKey(t *testing.T) {
	const key = "sk-test-PROVIDER-SECRET-9f3a71c2"
	body := "data: {\"choices\":[{\"delta\":{\"content\":\"sk-test ok\"}}]}\n\n" +
		"data: {\"error\":{\"message\":\"key Bearer " + key + " was revoked\"}}\n\n" + key[:10]
	want := strings.ReplaceAll(body, key, "[redacted]")
	for cut1 := 0; cut1 <= len(body); cut1++ {
		for _, cut2 := range []int{cut1, min(len(body), cut1+1), min(len(body), cut1+7), len(body)} {
			r := newStreamRedactor(key)
			var out strings.Builder
			for _, chunk := range []string{body[:cut1], body[cut1:cut2], body[cut2:]} {
				out.Write(r.write([]byte(chunk)))
			}
			out.Write(r.flush())
			if out.String() != want {
				t.Fatalf("cuts %d,%d:\n got %q\nwant %q", cut1, cut2, out.String(), want)
			}
		}
	}
	// Byte by byte.
	r := newStreamRedactor(key)
	var out strings.Builder
	for i := range len(body) {
		out.Write(r.write([]byte{body[i]}))
	}
	out.Write(r.flush())
	if out.String() != want {
		t.Fatalf("byte by byte: %q", out.String())
	}
}

func TestStreamRedactorPassesOtherBytesAtOnce(t *testing.T) {
	r := newStreamRedactor("sk-abcdefgh")
	if got := string(r.write([]byte("data: hello\n\n"))); got != "data: hello\n\n" {
		t.Fatalf("got %q", got)
	}
	// A tail that may begin the key waits; the next chunk releases it.
	if got := string(r.write([]byte("text sk-ab"))); got != "text " {
		t.Fatalf("got %q, want the tail held", got)
	}
	if got := string(r.write([]byte("X"))); got != "sk-abX" {
		t.Fatalf("got %q", got)
	}
	short := newStreamRedactor("abc")
	if got := string(short.write([]byte("abc"))); got != "abc" {
		t.Fatalf("a short key redacted: %q", got)
	}
}
