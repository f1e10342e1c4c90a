package sse

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
)

// refLine is a Line with its text as a string, for comparisons.
type refLine struct {
	Start     int64
	Text      string
	Truncated bool
}

func (l refLine) String() string {
	return fmt.Sprintf("{%d %q trunc=%v}", l.Start, l.Text, l.Truncated)
}

func lineOf(l Line) refLine { return refLine{l.Start, string(l.Text), l.Truncated} }

// referenceLines splits a stream fed so far into its lines the plain way
// the standard writes it (a leading BOM dropped; CRLF, CR or LF end a
// line), each with its offset and at most max bytes of its text, and
// returns the unterminated rest as pending.
func referenceLines(stream []byte, max int) (lines []refLine, pending refLine) {
	if len(stream) < len(bom) && bytes.HasPrefix(bom, stream) {
		return nil, refLine{Start: int64(len(stream))} // maybe a BOM: no line yet
	}
	off := 0
	if bytes.HasPrefix(stream, bom) {
		off = len(bom)
	}
	clip := func(start, end int) refLine {
		if end-start > max {
			return refLine{int64(start), string(stream[start : start+max]), true}
		}
		return refLine{int64(start), string(stream[start:end]), false}
	}
	start, afterCR := off, false
	for i := off; i < len(stream); i++ {
		c := stream[i]
		if afterCR && c == '\n' {
			afterCR, start = false, i+1
			continue
		}
		afterCR = false
		if c == '\r' || c == '\n' {
			lines = append(lines, clip(start, i))
			start, afterCR = i+1, c == '\r'
		}
	}
	return lines, clip(start, len(stream))
}

// checkLines feeds stream to a Reader of bound max (SkipTooLong) in the
// pieces cuts says, and checks FeedLines, Pending, Fed and Event.End
// against the plain reading of the stream.
func checkLines(t *testing.T, stream []byte, max int, cuts []int) {
	t.Helper()
	r := Reader{MaxSize: max, SkipTooLong: true}
	var lines []refLine
	var ends []int64
	fed := 0
	feed := func(p []byte) {
		err := r.FeedLines(p, func(l Line) {
			lines = append(lines, lineOf(l))
		}, func(e Event) error {
			// The blank line that dispatched the event was passed first,
			// and the event ends just past its line end.
			if n := len(lines); n == 0 || lines[n-1].Text != "" || lines[n-1].Start != e.End-1 {
				t.Fatalf("%q: event ending at %d emitted after lines %v", stream, e.End, lines)
			}
			ends = append(ends, e.End)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		fed += len(p)
		if r.Fed() != int64(fed) {
			t.Fatalf("%q: Fed %d after %d bytes", stream, r.Fed(), fed)
		}
		_, pending := referenceLines(stream[:fed], max)
		if got := lineOf(r.Pending()); got != pending {
			t.Fatalf("%q fed %d bytes: Pending %v, want %v", stream, fed, got, pending)
		}
	}
	rest := stream
	for _, c := range cuts {
		n := min(c, len(rest))
		feed(rest[:n])
		rest = rest[n:]
	}
	feed(rest)
	if want, _ := referenceLines(stream, max); !slices.Equal(lines, want) {
		t.Fatalf("%q cut at %v: lines\n got %v\nwant %v", stream, cuts, lines, want)
	}
	// Each event ends where a reader of the stream's first End bytes
	// dispatches it and one of a byte fewer does not.
	for i, end := range ends {
		if n := countEvents(stream[:end], max); n != i+1 {
			t.Fatalf("%q: event %d ends at %d, but the first %d bytes dispatch %d events", stream, i, end, end, n)
		}
		if n := countEvents(stream[:end-1], max); n != i {
			t.Fatalf("%q: event %d ends at %d, but the first %d bytes dispatch %d events", stream, i, end, end-1, n)
		}
	}
}

func countEvents(stream []byte, max int) int {
	r := Reader{MaxSize: max, SkipTooLong: true}
	n := 0
	_ = r.Feed(stream, func(Event) error { n++; return nil })
	return n
}

// TestLines: FeedLines passes every line with its offset, Pending says the
// unterminated line, Fed counts the bytes and each event says where it
// ends, whatever the line ends, a BOM, lines over the bound, and however
// the stream is cut.
func TestLines(t *testing.T) {
	for _, s := range []string{
		"data: 1\n\ndata: 2\r\n\r\n: comment\rdata: 3\r\rdata",
		"\xEF\xBB\xBFdata: after a BOM\n\n",
		"\xEF\xBBdata: no BOM\n\n",
		"data: a line far over the bound of sixteen bytes\ndata: x\n\ndata: y\n\ndata: unterminated and too long",
		"\r\n\n\r\r\n",
		"event: x\ndata: caf\xC3\xA9\xFF\r\ndata:[DONE]\r\n\r\n",
	} {
		for how, writes := range splits(s) {
			var cuts []int
			for _, w := range writes {
				cuts = append(cuts, len(w))
			}
			t.Run(how, func(t *testing.T) { checkLines(t, []byte(s), 16, cuts) })
		}
	}
}

// FuzzLines checks FeedLines, Pending, Fed and Event.End against the plain
// reading of the stream, for any stream cut anywhere.
func FuzzLines(f *testing.F) {
	for _, s := range []string{
		"data: YHOO\ndata: +2\ndata: 10\n\n",
		"\xEF\xBB\xBFevent: add\r\ndata: 1\r\n\r\nid: 2\x00\rdata: \xFF\r\r",
		"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n",
	} {
		f.Add([]byte(s), []byte{3, 1, 7}, uint8(16))
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte, max uint8) {
		var c []int
		for _, b := range cuts {
			c = append(c, int(b))
		}
		checkLines(t, stream, 1+int(max), c)
	})
}
