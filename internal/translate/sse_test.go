package translate

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// feed runs an SSEReader over writes and returns the events' data.
func feed(t testing.TB, writes []string) ([]string, error) {
	t.Helper()
	var r SSEReader
	var events []string
	emit := func(data []byte) error { events = append(events, string(data)); return nil }
	for _, w := range writes {
		if err := r.Feed([]byte(w), emit); err != nil {
			return events, err
		}
	}
	return events, r.Close(emit)
}

// bytewise splits s into one write per byte.
func bytewise(s string) []string {
	out := make([]string, len(s))
	for i := 0; i < len(s); i++ { // by byte, not by rune
		out[i] = s[i : i+1]
	}
	return out
}

func TestSSEReaderFraming(t *testing.T) {
	for _, c := range []struct {
		name   string
		writes []string
		want   []string
	}{
		{"one event", []string{"data: {\"a\":1}\n\n"}, []string{`{"a":1}`}},
		{"line split across writes", []string{"da", "ta: {\"a\"", ":1}\n", "\n"}, []string{`{"a":1}`}},
		{"several events in one write", []string{"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"}, []string{"1", "2", "[DONE]"}},
		{"data without a space", []string{"data:1\n\ndata:  2\n\n"}, []string{"1", " 2"}},
		{"CRLF line ends", []string{"data: 1\r\n\r\ndata: 2\r\n\r\n"}, []string{"1", "2"}},
		{"CR line ends", []string{"data: 1\r\rdata: 2\r\r"}, []string{"1", "2"}},
		{"CRLF split between writes", []string{"data: 1\r", "\n\r", "\ndata: 2\r\n\r\n"}, []string{"1", "2"}},
		{"CR then CR across writes", []string{"data: 1\r", "\r"}, []string{"1"}},
		{"multibyte character split", []string{"data: h\xc3", "\xa9llo \xe2\x82", "\xac\n\n"}, []string{"héllo €"}},
		{"multi-line data", []string{"data: a\ndata: b\n\n"}, []string{"a\nb"}},
		{"comments and other fields", []string{": ping\nevent: message\nid: 7\nretry: 10\ndata: x\n\n"}, []string{"x"}},
		{"blank lines without data", []string{"\n\n: c\n\n"}, nil},
		{"empty data field", []string{"data:\n\n"}, []string{""}},
		{"byte order mark", []string{"\xef\xbb", "\xbfdata: 1\n\n"}, []string{"1"}},
		{"last event without a blank line", []string{"data: 1\n\ndata: [DONE]"}, []string{"1", "[DONE]"}},
		{"usage chunk with empty choices", []string{`data: {"choices":[],"usage":{"prompt_tokens":1}}` + "\n\n"}, []string{`{"choices":[],"usage":{"prompt_tokens":1}}`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := feed(t, c.writes)
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
			got, err = feed(t, bytewise(strings.Join(c.writes, "")))
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("byte by byte: got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestSSEReaderLineLimit(t *testing.T) {
	r := SSEReader{MaxLine: 8}
	emit := func([]byte) error { return nil }
	if err := r.Feed([]byte("data: 12"), emit); err != nil {
		t.Fatal(err)
	}
	if err := r.Feed([]byte("3\n\n"), emit); !errors.Is(err, ErrSSELineTooLong) {
		t.Fatalf("err %v, want ErrSSELineTooLong", err)
	}
}

// FuzzSSEReader checks that how a stream is cut into writes never changes
// its events: the whole input at once, byte by byte, and in writes of the
// fuzzed size all give the same events, without a panic.
func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: 1\r\n\r\ndata:2\r\rdata: [DONE]\n\n"), uint8(3))
	f.Add([]byte("\xef\xbb\xbfdata: h\xc3\xa9\n: c\n\n"), uint8(1))
	f.Fuzz(func(t *testing.T, body []byte, size uint8) {
		whole, errWhole := feed(t, []string{string(body)})
		bytes1, err1 := feed(t, bytewise(string(body)))
		n := int(size%16) + 1
		var writes []string
		for i := 0; i < len(body); i += n {
			writes = append(writes, string(body[i:min(i+n, len(body))]))
		}
		sized, errN := feed(t, writes)
		if (errWhole == nil) != (err1 == nil) || (errWhole == nil) != (errN == nil) {
			t.Fatalf("errors differ: %v, %v, %v", errWhole, err1, errN)
		}
		if errWhole == nil && (!slices.Equal(whole, bytes1) || !slices.Equal(whole, sized)) {
			t.Fatalf("events differ: %q, %q, %q", whole, bytes1, sized)
		}
	})
}
