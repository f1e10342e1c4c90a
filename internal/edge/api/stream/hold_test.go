package stream

import (
	"bytes"
	"strings"
	"testing"
)

// feed passes chunks through a FinalHold and returns what Split let
// through, in order, and what it held at the end.
func feed(sse bool, chunks ...string) (passed, held string) {
	h := FinalHold{SSE: sse}
	var out strings.Builder
	for _, c := range chunks {
		out.Write(h.Split([]byte(c)))
	}
	return out.String(), string(h.Rest())
}

func TestFinalHoldKeepsOnlyTheAnswersEnd(t *testing.T) {
	const content = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
	for _, tc := range []struct {
		name         string
		sse          bool
		chunks       []string
		passed, held string
	}{
		{"SSE: [DONE] with the last content", true, []string{content + "data: [DONE]\n\n"}, content, "data: [DONE]\n\n"},
		{"SSE: [DONE] alone", true, []string{content, "data: [DONE]\n\n"}, content, "data: [DONE]\n\n"},
		{"SSE: [DONE] cut anywhere", true, []string{content + "da", "ta: [DO", "NE]", "\n", "\n"}, content, "data: [DONE]\n\n"},
		{"SSE: no space, CRLF", true, []string{content + "data:[DONE]\r\n\r\n"}, content, "data:[DONE]\r\n\r\n"},
		{"SSE: an error event ends it, with what follows", true,
			[]string{content + "data: {\"error\":{\"message\":\"boom\"}}\n\n", "data: [DONE]\n\n"},
			content, "data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n"},
		{"SSE: a content event passes whole", true, []string{content, content}, content + content, ""},
		{"SSE: a content line cut near its start waits for the rest", true, []string{content + "data: {\"", "choices\":[]}\n\n"},
			content + "data: {\"choices\":[]}\n\n", ""},
		{"SSE: a held prefix that is no end passes when it turns out so", true, []string{"data: [DON", "E]x\n\n"}, "data: [DONE]x\n\n", ""},
		{"SSE: [DONE] inside a line is content", true,
			[]string{"data: {\"choices\":[{\"delta\":{\"content\":\"", "data: [DONE]\"}}]}\n\n"},
			"data: {\"choices\":[{\"delta\":{\"content\":\"data: [DONE]\"}}]}\n\n", ""},
		{"SSE: comments and other fields pass", true, []string{": keep-alive\n\nevent: x\n"}, ": keep-alive\n\nevent: x\n", ""},
		{"SSE: a stream cut without its end", true, []string{content + "data: [DO"}, content, "data: [DO"},
		{"JSON: its last byte waits", false, []string{`{"id":"x","usage":{}}` + "\n"}, `{"id":"x","usage":{}`, "}\n"},
		{"JSON: in pieces", false, []string{`{"id":`, `"x"`, "}", "\n", " "}, `{"id":"x"`, "}\n "},
		{"JSON: blanks first", false, []string{"\n ", "{}"}, "\n {", "}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			passed, held := feed(tc.sse, tc.chunks...)
			if passed != tc.passed || held != tc.held {
				t.Errorf("passed %q held %q\nwant   %q held %q", passed, held, tc.passed, tc.held)
			}
		})
	}
}

// FuzzFinalHold: whatever the provider sends and however it is cut, the
// bytes split lets through followed by the held rest are the bytes sent,
// in order; for an event stream, no line that ends the stream is ever let
// through before the end, nor anything after one, and a stream without
// one is let through but for a last partial line that may become one; for
// another body, everything but its last non-blank byte and what follows.
func FuzzFinalHold(f *testing.F) {
	f.Add(true, []byte("data: {\"choices\":[]}\n\ndata: [DONE]\n\n"), []byte{3, 17, 1})
	f.Add(true, []byte("data: {\"error\":{}}\r\n\r\ndata: [DONE]\r\n\r\n"), []byte{5})
	f.Add(true, []byte("data: x\rdata:[DONE]\r"), []byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	f.Add(false, []byte("{\"a\":1}\n"), []byte{2})
	f.Fuzz(func(t *testing.T, sse bool, data, cuts []byte) {
		var chunks []string
		rest := data
		for _, c := range cuts {
			n := min(int(c), len(rest))
			chunks = append(chunks, string(rest[:n]))
			rest = rest[n:]
		}
		chunks = append(chunks, string(rest))
		passed, held := feed(sse, chunks...)
		if passed+held != string(data) {
			t.Fatalf("passed %q + held %q != sent %q", passed, held, data)
		}
		if !sse {
			want := len(data) - 1
			for want >= 0 && strings.ContainsRune(" \t\r\n", rune(data[want])) {
				want--
			}
			want = max(want, 0)
			if len(passed) != want {
				t.Fatalf("%q: passed %q, want all before the last non-blank byte", data, passed)
			}
			return
		}
		// The first line that ends the stream, if any, starts the held part.
		end := -1
		for start := 0; start < len(data); {
			i := bytes.IndexAny(data[start:], "\r\n")
			if i < 0 {
				break
			}
			if endsStream(data[start : start+i]) {
				end = start
				break
			}
			start += i + 1
		}
		switch {
		case end >= 0:
			if len(passed) != end {
				t.Fatalf("%q: passed %q, want all before the line that ends the stream at %d", data, passed, end)
			}
		default:
			lastLine := bytes.LastIndexAny(data, "\r\n") + 1
			if len(passed) != len(data) && (len(passed) != lastLine || !mayEndStream(data[lastLine:])) {
				t.Fatalf("%q: passed %q held %q, want all but a last partial line that may end the stream", data, passed, held)
			}
		}
	})
}
