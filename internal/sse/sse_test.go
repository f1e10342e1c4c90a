package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// ev is an Event with its data as a string, for comparisons.
type ev struct {
	Type, Data, ID string
}

func (e ev) String() string { return fmt.Sprintf("{%q %q id=%q}", e.Type, e.Data, e.ID) }

// run feeds writes to r and ends the stream; it returns the events.
func run(t testing.TB, r *Reader, writes ...string) ([]ev, bool, error) {
	t.Helper()
	var got []ev
	emit := func(e Event) error {
		got = append(got, ev{e.Type, string(e.Data), e.ID})
		return nil
	}
	for _, w := range writes {
		if err := r.Feed([]byte(w), emit); err != nil {
			return got, false, err
		}
	}
	return got, r.End(), nil
}

// splits returns ways to write s: whole, byte by byte, and at random
// points (deterministic).
func splits(s string) map[string][]string {
	out := map[string][]string{"whole": {s}}
	var bytewise []string
	for i := 0; i < len(s); i++ {
		bytewise = append(bytewise, s[i:i+1])
	}
	out["bytewise"] = bytewise
	rng := rand.New(rand.NewPCG(1, uint64(len(s))))
	for k := range 3 {
		var parts []string
		for rest := s; len(rest) > 0; {
			n := 1 + rng.IntN(min(len(rest), 7))
			parts, rest = append(parts, rest[:n]), rest[n:]
		}
		out[fmt.Sprintf("random%d", k)] = parts
	}
	return out
}

func msg(data string) ev { return ev{"message", data, ""} }

// TestSpecExamples runs the examples of the WHATWG HTML standard's
// "Server-sent events" section (9.2.5 "Parsing an event stream" and the
// "event" and "id" discussions of 9.2.6), with the events the standard
// says they dispatch.
func TestSpecExamples(t *testing.T) {
	for _, c := range []struct {
		name, stream string
		want         []ev
	}{
		{
			// "The following event stream, once followed by a blank line:
			// would cause an event message with the interface MessageEvent
			// to be dispatched on the EventSource object. The event's data
			// attribute would contain the string "YHOO\n+2\n10"."
			"stock ticker", "data: YHOO\ndata: +2\ndata: 10\n\n",
			[]ev{msg("YHOO\n+2\n10")},
		},
		{
			// "The following stream contains four blocks. The first block
			// has just a comment, and will fire nothing. The second block
			// has two fields with names "data" and "id" respectively; an
			// event will be fired for this block, with the data "first
			// event", and will then set the last event ID to "1" ... The
			// third block fires an event with data "second event", and also
			// has an "id" field, this time with no value, which resets the
			// last event ID to the empty string ... The fourth block has
			// only one line, which does not have a trailing blank line,
			// so it is discarded."
			"comment, ids and a discarded last block",
			": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n",
			[]ev{{"message", "first event", "1"}, {"message", "second event", ""}},
		},
		{
			// "The following stream fires two events: ... The first block
			// fires events with the data set to the empty string, as would
			// the last block if it was followed by a blank line. The middle
			// block fires an event with the data set to a single newline
			// character. The last block is discarded because it is not
			// followed by a blank line."
			"empty data", "data\n\ndata\ndata\n\ndata:",
			[]ev{msg(""), msg("\n")},
		},
		{
			// "The following stream fires two identical events: This is
			// because the space after the colon is ignored if present."
			"one space after the colon", "data:test\n\ndata: test\n\n",
			[]ev{msg("test"), msg("test")},
		},
		{
			// The "event" field example: three events of types add, remove, add.
			"event types", "event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\nevent: add\ndata: 113411\n\n",
			[]ev{{"add", "73857293", ""}, {"remove", "2153", ""}, {"add", "113411", ""}},
		},
	} {
		for how, writes := range splits(c.stream) {
			t.Run(c.name+"/"+how, func(t *testing.T) {
				var r Reader
				got, _, err := run(t, &r, writes...)
				if err != nil || !slices.Equal(got, c.want) {
					t.Fatalf("got %v, %v; want %v", got, err, c.want)
				}
				if want := reference([]byte(c.stream)); !slices.Equal(want, c.want) {
					t.Fatalf("the reference interpretation says %v", want)
				}
			})
		}
	}
}

// TestRules checks each rule of the standard's interpretation, however
// the stream is split.
func TestRules(t *testing.T) {
	for _, c := range []struct {
		name, stream string
		want         []ev
	}{
		{"LF line ends", "data: 1\n\ndata: 2\n\n", []ev{msg("1"), msg("2")}},
		{"CRLF line ends", "data: 1\r\n\r\ndata: 2\r\n\r\n", []ev{msg("1"), msg("2")}},
		{"CR line ends", "data: 1\r\rdata: 2\r\r", []ev{msg("1"), msg("2")}},
		{"mixed line ends", "data: a\rdata: b\r\ndata: c\n\r\n", []ev{msg("a\nb\nc")}},
		{"LF CR is two line ends", "data: 1\n\rdata: 2\n\n", []ev{msg("1"), msg("2")}},
		{"a BOM is dropped", "\xEF\xBB\xBFdata: 1\n\n", []ev{msg("1")}},
		{"only one BOM is dropped", "\xEF\xBB\xBF\xEF\xBB\xBFdata: 1\n\ndata: 2\n\n", []ev{msg("2")}},
		{"a BOM later is a character", "data: \xEF\xBB\xBF1\n\n", []ev{msg("\uFEFF1")}},
		{"comments", ":ping\n: x\ndata: 1\n:\n\n", []ev{msg("1")}},
		{"a comment alone dispatches nothing", ": keep-alive\n\n", nil},
		{"a field without a colon has an empty value", "data\ndata\n\n", []ev{msg("\n")}},
		{"only one space is removed", "data:  two\n\ndata:\ttab\n\n", []ev{msg(" two"), msg("\ttab")}},
		{"the value may hold colons", "data: a: b:c\n\n", []ev{msg("a: b:c")}},
		{"a field name is case-sensitive", "Data: 1\nDATA: 2\n\n", nil},
		{"unknown fields are ignored", "foo: bar\ndata: 1\nbaz\n\n", []ev{msg("1")}},
		{"event sets the type of one event", "event: add\ndata: 1\n\ndata: 2\n\n", []ev{{"add", "1", ""}, msg("2")}},
		{"an event without data sets no type", "event: add\n\ndata: 2\n\n", []ev{msg("2")}},
		{"an empty event field is message", "event\ndata: 1\n\n", []ev{msg("1")}},
		{"the last event field wins", "event: a\nevent: b\ndata: 1\n\n", []ev{{"b", "1", ""}}},
		{"the id stays for later events", "id: 7\ndata: 1\n\ndata: 2\n\n", []ev{{"message", "1", "7"}, {"message", "2", "7"}}},
		{"an id without data is kept", "id: 7\n\ndata: 1\n\n", []ev{{"message", "1", "7"}}},
		{"an id with NUL is ignored", "id: 1\ndata: a\n\nid: 2\x003\ndata: b\n\n", []ev{{"message", "a", "1"}, {"message", "b", "1"}}},
		{"an empty id resets it", "id: 1\ndata: a\n\nid:\ndata: b\n\n", []ev{{"message", "a", "1"}, {"message", "b", ""}}},
		{"retry is no data", "retry: 10\n\n", nil},
		{"blank lines dispatch nothing", "\n\n\r\n\r\r\n", nil},
		{"an unterminated last event is discarded", "data: 1\n\ndata: 2", []ev{msg("1")}},
		{"an event ended by one line end is discarded", "data: 1\n\ndata: 2\n", []ev{msg("1")}},
		{"invalid UTF-8 becomes U+FFFD", "data: a\xFFb\xC3\n\n", []ev{msg("a\uFFFDb\uFFFD")}},
		{"a split UTF-8 sequence is whole", "data: h\xC3\xA9 \xE2\x82\xAC\n\n", []ev{msg("hé €")}},
		{"an OpenAI stream", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", []ev{msg(`{"choices":[]}`), msg("[DONE]")}},
	} {
		want := reference([]byte(c.stream))
		if !slices.Equal(want, c.want) {
			t.Errorf("%s: the reference interpretation says %v, the case %v", c.name, want, c.want)
		}
		for how, writes := range splits(c.stream) {
			t.Run(c.name+"/"+how, func(t *testing.T) {
				var r Reader
				got, _, err := run(t, &r, writes...)
				if err != nil || !slices.Equal(got, c.want) {
					t.Fatalf("got %v, %v; want %v", got, err, c.want)
				}
			})
		}
	}
}

func TestRetry(t *testing.T) {
	for _, c := range []struct {
		stream string
		ms     int64
		ok     bool
	}{
		{"retry: 1500\n", 1500, true},
		{"retry:0\n", 0, true},
		{"retry: 15x\n", 0, false},
		{"retry: -1\n", 0, false},
		{"retry: 1.5\n", 0, false},
		{"retry:\n", 0, false},
		{"retry:  10\n", 0, false}, // the second space is part of the value
		{"retry: 10\nretry: oops\n", 10, true},
		{"retry: 99999999999999999999\n", 0, false}, // does not fit
	} {
		var r Reader
		if _, _, err := run(t, &r, c.stream); err != nil {
			t.Fatal(err)
		}
		if ms, ok := r.Retry(); ms != c.ms || ok != c.ok {
			t.Errorf("%q: Retry() = %d, %v; want %d, %v", c.stream, ms, ok, c.ms, c.ok)
		}
	}
}

func TestEndReportsDiscarded(t *testing.T) {
	for stream, want := range map[string]bool{
		"data: 1\n\n":      false,
		"":                 false,
		": c\n":            false,
		"data: 1\n":        true,
		"data: 1":          true,
		"event: x\n":       true,
		"\xEF\xBB":         true,
		"data: 1\n\nda":    true,
		"id: 3\n":          false, // an id is not an event
		"data: 1\n\n\r\n":  false,
		"data: 1\r\n\r\n ": true,
	} {
		var r Reader
		if _, discarded, err := run(t, &r, stream); err != nil || discarded != want {
			t.Errorf("%q: End() = %v, %v; want %v", stream, discarded, err, want)
		}
	}
}

// TestEndStartsAgain: after End the Reader reads a new stream (a
// reconnection): its BOM is dropped, and the last event ID carries over.
func TestEndStartsAgain(t *testing.T) {
	var r Reader
	got, _, _ := run(t, &r, "id: 4\ndata: a\n\ndata: cut")
	got2, _, _ := run(t, &r, "\xEF\xBB\xBFdata: b\n\n")
	if want := []ev{{"message", "a", "4"}, {"message", "b", "4"}}; !slices.Equal(append(got, got2...), want) {
		t.Fatalf("got %v, want %v", append(got, got2...), want)
	}
	if r.LastEventID() != "4" {
		t.Fatalf("LastEventID %q", r.LastEventID())
	}
}

func TestTooLong(t *testing.T) {
	long := strings.Repeat("x", 40)
	t.Run("error", func(t *testing.T) {
		for how, writes := range splits("data: 1\n\ndata: " + long + "\n\ndata: 2\n\n") {
			r := Reader{MaxSize: 32}
			got, _, err := run(t, &r, writes...)
			if !errors.Is(err, ErrTooLong) || !slices.Equal(got, []ev{msg("1")}) {
				t.Fatalf("%s: got %v, %v; want the first event and ErrTooLong", how, got, err)
			}
			if err := r.Feed([]byte("data: 3\n\n"), func(Event) error { return nil }); !errors.Is(err, ErrTooLong) {
				t.Fatalf("%s: Feed after ErrTooLong: %v", how, err)
			}
		}
	})
	t.Run("skip", func(t *testing.T) {
		for _, stream := range []string{
			"data: 1\n\ndata: " + long + "\n\ndata: 2\n\n",                          // one long line
			"data: 1\n\nid: 9\ndata: " + long + "\ndata: x\n\ndata: 2\n\n",          // the whole event goes
			"data: 1\n\n" + strings.Repeat("data: abcdefgh\n", 8) + "\ndata: 2\n\n", // data over the bound
			"data: 1\n\n:" + long + "\n\ndata: 2\n\n",                               // a long comment between events drops none
		} {
			for how, writes := range splits(stream) {
				r := Reader{MaxSize: 32, SkipTooLong: true}
				got, _, err := run(t, &r, writes...)
				want := []ev{msg("1"), msg("2")}
				if strings.Contains(stream, "id: 9") {
					want[1].ID = "9"
				}
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("%q %s: got %v, %v; want %v", stream, how, got, err, want)
				}
			}
		}
	})
	t.Run("at the bound", func(t *testing.T) {
		line := "data: " + strings.Repeat("y", 26) // 32 bytes
		r := Reader{MaxSize: 32}
		if got, _, err := run(t, &r, line+"\n\n"); err != nil || len(got) != 1 {
			t.Fatalf("a line of exactly MaxSize bytes: %v, %v", got, err)
		}
	})
}

// TestEmitError: Feed stops at emit's error and returns it.
func TestEmitError(t *testing.T) {
	stop := errors.New("stop")
	var r Reader
	var seen []string
	err := r.Feed([]byte("data: 1\n\ndata: 2\n\ndata: 3\n\n"), func(e Event) error {
		seen = append(seen, string(e.Data))
		if string(e.Data) == "2" {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || !slices.Equal(seen, []string{"1", "2"}) {
		t.Fatalf("seen %v, err %v", seen, err)
	}
}

func TestReadAll(t *testing.T) {
	stream := "\xEF\xBB\xBF: hi\r\ndata: a\r\ndata: b\r\n\r\nevent: e\rdata: c\r\rdata: cut"
	var got []ev
	err := ReadAll(iotest.OneByteReader(strings.NewReader(stream)), func(e Event) error {
		got = append(got, ev{e.Type, string(e.Data), e.ID})
		return nil
	})
	if want := []ev{msg("a\nb"), {"e", "c", ""}}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	broken := iotest.TimeoutReader(strings.NewReader("data: a\n\ndata: b\n\n"))
	if err := ReadAll(broken, func(Event) error { return nil }); !errors.Is(err, iotest.ErrTimeout) {
		t.Fatalf("a failing reader: %v", err)
	}
	stop := errors.New("stop")
	if err := ReadAll(strings.NewReader("data: a\n\n"), func(Event) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("emit's error: %v", err)
	}
}

func TestScanner(t *testing.T) {
	sc := NewScanner(iotest.HalfReader(strings.NewReader("retry: 5\n\ndata: a\n\nevent: x\ndata:\n\ndata: cut")))
	var got []ev
	for {
		e, err := sc.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev{e.Type, string(e.Data), e.ID})
	}
	if want := []ev{msg("a"), {"x", "", ""}}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if _, err := sc.Next(); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after the end: %v", err)
	}
	sc = NewScanner(iotest.TimeoutReader(strings.NewReader("data: a\n\ndata: b\n\n")))
	for _, want := range []string{"a", "b"} {
		if e, err := sc.Next(); err != nil || string(e.Data) != want {
			t.Fatalf("event %q, %v; want %q", e.Data, err, want)
		}
	}
	if _, err := sc.Next(); !errors.Is(err, iotest.ErrTimeout) {
		t.Fatalf("a failing reader: %v", err)
	}
}

// TestUTF8Repair checks the replacement of ill-formed UTF-8 against the
// Unicode Standard's example of "U+FFFD substitution of maximal subparts"
// (chapter 3, table 3-8), which the WHATWG UTF-8 decoder follows.
func TestUTF8Repair(t *testing.T) {
	for in, want := range map[string]string{
		"\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64": "a\uFFFD\uFFFD\uFFFDb\uFFFDc\uFFFD\uFFFDd",
		"\xC0\xAF":             "\uFFFD\uFFFD",             // C0 is never a lead byte
		"\xE0\x80\xAF":         "\uFFFD\uFFFD\uFFFD",       // overlong: 80 is not after E0
		"\xED\xA0\x80":         "\uFFFD\uFFFD\uFFFD",       // a surrogate
		"\xF4\x90\x80\x80":     "\uFFFD\uFFFD\uFFFD\uFFFD", // above U+10FFFF
		"\xF0\x9F\x98":         "\uFFFD",                   // a truncated 4-byte sequence
		"\xEF\xBF\xBD":         "\uFFFD",                   // U+FFFD itself is valid
		"ok \xE2\x82\xAC \xFF": "ok € \uFFFD",
	} {
		if got := string(appendValidUTF8(nil, []byte(in))); got != want {
			t.Errorf("%q: got %q, want %q", in, got, want)
		}
	}
}

// reference interprets a whole stream the plain way the standard writes
// it: decode, split into lines, process each line, discard the rest.
func reference(stream []byte) []ev {
	stream = bytes.TrimPrefix(stream, bom)
	text := string(appendValidUTF8(nil, stream))
	var (
		out               []ev
		data, typ, lastID string
	)
	for {
		i := strings.IndexAny(text, "\r\n")
		if i < 0 {
			return out // the rest has no line end: discarded
		}
		line := text[:i]
		if text[i] == '\r' && i+1 < len(text) && text[i+1] == '\n' {
			i++
		}
		text = text[i+1:]
		switch {
		case line == "":
			lastEventID := lastID
			if data == "" {
				typ = ""
				continue
			}
			data = strings.TrimSuffix(data, "\n")
			name := "message"
			if typ != "" {
				name = typ
			}
			out = append(out, ev{name, data, lastEventID})
			data, typ = "", ""
		case strings.HasPrefix(line, ":"):
		default:
			field, value, found := strings.Cut(line, ":")
			if found {
				value = strings.TrimPrefix(value, " ")
			}
			switch field {
			case "event":
				typ = value
			case "data":
				data += value + "\n"
			case "id":
				if !strings.Contains(value, "\x00") {
					lastID = value
				}
			}
		}
	}
}

// FuzzReader checks that the Reader, fed the stream in the pieces the
// fuzzer chooses, dispatches exactly the events of the reference
// interpretation of the whole stream.
func FuzzReader(f *testing.F) {
	for _, s := range []string{
		"data: YHOO\ndata: +2\ndata: 10\n\n",
		": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n",
		"data\n\ndata\ndata\n\ndata:",
		"\xEF\xBB\xBFevent: add\r\ndata: 1\r\n\r\nid: 2\x00\rdata: \xFF\r\r",
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
	} {
		f.Add([]byte(s), []byte{3, 1, 7})
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		var r Reader
		var got []ev
		emit := func(e Event) error {
			got = append(got, ev{e.Type, string(e.Data), e.ID})
			return nil
		}
		rest := stream
		for _, c := range cuts {
			if len(rest) == 0 {
				break
			}
			n := min(int(c), len(rest))
			if err := r.Feed(rest[:n], emit); err != nil {
				t.Fatal(err)
			}
			rest = rest[n:]
		}
		if err := r.Feed(rest, emit); err != nil {
			t.Fatal(err)
		}
		r.End()
		if want := reference(stream); !slices.Equal(got, want) {
			t.Fatalf("stream %q cut at %v:\n got %v\nwant %v", stream, cuts, got, want)
		}
	})
}

// BenchmarkReader measures the reading of one typical OpenAI stream event
// (a chat.completion.chunk of one token), as the tunnel's observers read
// every event of every stream. One op is one event.
func BenchmarkReader(b *testing.B) {
	chunk := []byte(`data: {"id":"chatcmpl-sim-1","object":"chat.completion.chunk","created":1767225600,"model":"bench","system_fingerprint":"fp_sim","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}]}` + "\n\n")
	var r Reader
	n := 0
	emit := func(e Event) error { n += len(e.Data); return nil }
	b.ReportAllocs()
	b.SetBytes(int64(len(chunk)))
	for b.Loop() {
		if err := r.Feed(chunk, emit); err != nil {
			b.Fatal(err)
		}
	}
	if n == 0 {
		b.Fatal("no event")
	}
}
