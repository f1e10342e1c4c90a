package sse

import (
	"bytes"
	"errors"
	"io"
	"strconv"
	"unicode/utf8"
)

// DefaultMaxSize is a Reader's default bound, in bytes, on one line
// (without its line end) and on one event's data.
const DefaultMaxSize = 1 << 20 // 1 MiB

// ErrTooLong is Feed's error for a line or an event's data over the
// Reader's bound (Reader.MaxSize), unless Reader.SkipTooLong is set.
var ErrTooLong = errors.New("sse: a line or an event is longer than the reader's limit")

// bom is U+FEFF in UTF-8.
var bom = []byte("\xEF\xBB\xBF")

// Event is one dispatched event (WHATWG HTML, "dispatch the event").
type Event struct {
	// Type is the event type: the value of the event's last "event" field,
	// or "message" when it had none.
	Type string
	// Data is the value of the event's "data" fields joined by LF. It is
	// valid only during the call it is passed to.
	Data []byte
	// ID is the stream's last event ID when the event was dispatched: the
	// value of the latest "id" field (of this event or an earlier one)
	// holding no NUL, "" if none.
	ID string
	// End is where the event ends in the stream: the offset, in bytes
	// since the stream began (a BOM counts), just past the CR or LF that
	// ended the blank line dispatching it. A reader of the stream's first
	// End bytes dispatches it; one of fewer does not.
	End int64
}

// Line is one line of the stream as a Reader reads it, before it is
// interpreted (FeedLines, Pending).
type Line struct {
	// Start is the offset of the line's first byte in the stream, in bytes
	// since it began (a BOM counts; it is no part of the first line).
	Start int64
	// Text is the line without its line end, its bytes as they came
	// (invalid UTF-8 not yet replaced), at most the Reader's MaxSize
	// bytes: of a longer line (SkipTooLong) its first MaxSize bytes, with
	// Truncated set. It is valid only until the Reader is fed again.
	Text      []byte
	Truncated bool
}

// Reader turns a text/event-stream body, fed in chunks of any size, into
// its events (see the package doc for the rules). Bytes are buffered until
// their line ends, so the events do not depend on how the body was split.
// The zero value is ready to use, with a bound of DefaultMaxSize. A Reader
// is used by one goroutine at a time.
type Reader struct {
	// MaxSize bounds one line and one event's data, in bytes; 0 means
	// DefaultMaxSize.
	MaxSize int
	// SkipTooLong makes a line over MaxSize, or data growing over it, drop
	// the event it belongs to (it is not dispatched; the stream goes on)
	// instead of failing Feed with ErrTooLong. Observers of a stream they
	// relay set it: a huge event is then simply not looked at.
	SkipTooLong bool

	line      []byte // the current line, not yet ended
	data      []byte // the data buffer
	eventType string // the event type buffer
	lastID    string // the last event ID buffer
	retry     int64  // the reconnection time, in milliseconds, if hasRetry
	hasRetry  bool
	afterCR   bool  // the previous byte was a CR: an LF now ends nothing
	started   bool  // the BOM check is done
	skipLine  bool  // the current line went over the bound: line keeps its head, its rest is dropped
	broken    bool  // the current event went over the bound: it is not dispatched
	err       error // ErrTooLong, once returned
	fixed     []byte
	fed       int64 // the bytes fed since the stream began (Fed)
	lineStart int64 // the offset of the current line's first byte
}

// Feed reads the next bytes of the stream and calls emit with each event
// they complete, in order. It returns emit's first error (the events after
// it in p are not read), or ErrTooLong; once it returned ErrTooLong it
// returns it again.
func (r *Reader) Feed(p []byte, emit func(Event) error) error {
	return r.feed(p, nil, emit)
}

// FeedLines is Feed that also calls line with each line the bytes
// complete, blank lines and comments included, in order, before the line
// is interpreted: before emit is called with the event the line
// dispatches. A line over MaxSize fails FeedLines before line is called,
// unless SkipTooLong: then line gets its head (Line.Truncated). For a
// reader of the stream that needs to know where in the bytes something
// is (a relay that holds back the line ending a stream), so the bytes are
// parsed once for it and for the events' readers.
func (r *Reader) FeedLines(p []byte, line func(Line), emit func(Event) error) error {
	return r.feed(p, line, emit)
}

// Fed is the number of bytes fed since the stream began (since the Reader
// was made or last ended), a BOM included: the offset the next byte fed
// will have.
func (r *Reader) Fed() int64 { return r.fed }

// Pending is the stream's current line, not yet ended, as the bytes fed so
// far have it: Text is empty when the bytes fed end with a line end (or
// are only the start of a possible BOM); Start is where the line began,
// or will begin. Its Text is valid until the Reader is fed again.
func (r *Reader) Pending() Line {
	if !r.started {
		return Line{Start: r.fed}
	}
	return Line{Start: r.lineStart, Text: r.line, Truncated: r.skipLine}
}

func (r *Reader) feed(p []byte, onLine func(Line), emit func(Event) error) error {
	if r.err != nil {
		return r.err
	}
	pos := r.fed // the offset of p[0]
	r.fed += int64(len(p))
	if !r.started {
		if len(r.line)+len(p) < len(bom) && bytes.HasPrefix(bom, append(r.line, p...)) {
			// The BOM may itself arrive split: wait until it can be told.
			r.line = append(r.line, p...)
			return nil
		}
		r.started = true
		if len(r.line) > 0 {
			pos -= int64(len(r.line))
			p = append(r.line[:len(r.line):len(r.line)], p...)
			r.line = nil
		}
		if bytes.HasPrefix(p, bom) {
			p, pos = p[len(bom):], pos+int64(len(bom))
		}
		r.lineStart = pos
	}
	for len(p) > 0 {
		if r.afterCR {
			r.afterCR = false
			if p[0] == '\n' {
				p, pos = p[1:], pos+1
				r.lineStart = pos
				continue
			}
		}
		i := lineEnd(p)
		if i < 0 {
			return r.keep(p)
		}
		var line []byte
		skip := r.skipLine
		switch {
		case skip:
			r.skipLine = false
			line = r.line // its head
		case len(r.line) == 0:
			line = p[:i]
		default:
			r.line = append(r.line, p[:i]...)
			line = r.line
		}
		if !skip && len(line) > r.max() {
			if err := r.tooLong(); err != nil {
				return err
			}
			skip, line = true, line[:r.max()]
		}
		r.afterCR = p[i] == '\r'
		p, pos = p[i+1:], pos+int64(i)+1
		start := r.lineStart
		r.lineStart = pos
		if onLine != nil {
			onLine(Line{Start: start, Text: line, Truncated: skip})
		}
		var err error
		if !skip {
			err = r.processLine(line, pos, emit)
		}
		r.line = r.line[:0]
		if err != nil {
			return err
		}
	}
	return nil
}

// End ends the stream: whatever was not dispatched (an unfinished line, an
// event without its closing empty line) is discarded, as the standard
// says, and reported by discarded. The last event ID and the reconnection
// time stay; the Reader is then ready for another stream (a reconnection).
func (r *Reader) End() (discarded bool) {
	discarded = len(r.line) > 0 || r.skipLine || len(r.data) > 0 || r.eventType != "" || r.broken
	r.line, r.data, r.eventType = r.line[:0], r.data[:0], ""
	r.afterCR, r.started, r.skipLine, r.broken = false, false, false, false
	r.fed, r.lineStart = 0, 0
	return discarded
}

// LastEventID is the stream's last event ID so far (the latest "id" field
// holding no NUL), "" if none.
func (r *Reader) LastEventID() string { return r.lastID }

// Retry is the reconnection time the stream set with its latest "retry"
// field of ASCII digits, in milliseconds; ok is false when it set none.
func (r *Reader) Retry() (ms int64, ok bool) { return r.retry, r.hasRetry }

// ReadAll feeds everything src yields to a new Reader, calling emit with
// each event, and ends the stream at src's EOF (an unfinished last event
// is discarded). It returns emit's first error (then it stops reading),
// ErrTooLong, or src's error other than io.EOF.
func ReadAll(src io.Reader, emit func(Event) error) error {
	var r Reader
	buf := make([]byte, 16<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if ferr := r.Feed(buf[:n], emit); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			r.End()
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Scanner reads the events of a stream from an io.Reader one at a time,
// for callers that pull (a client waiting for its next event).
type Scanner struct {
	src   io.Reader
	r     Reader
	buf   []byte
	queue []Event // events read but not yet returned; Data copied
	err   error
}

// NewScanner returns a Scanner reading src with a Reader of the default
// bound.
func NewScanner(src io.Reader) *Scanner { return &Scanner{src: src} }

// Next returns the next event, reading src as needed; its Data stays
// valid. At src's EOF it returns io.EOF (an unfinished last event is
// discarded); it returns ErrTooLong, or src's other errors, as they come.
func (s *Scanner) Next() (Event, error) {
	for len(s.queue) == 0 {
		if s.err != nil {
			return Event{}, s.err
		}
		if s.buf == nil {
			s.buf = make([]byte, 16<<10)
		}
		n, err := s.src.Read(s.buf)
		if n > 0 {
			if ferr := s.r.Feed(s.buf[:n], func(e Event) error {
				e.Data = bytes.Clone(e.Data)
				if e.Data == nil {
					e.Data = []byte{}
				}
				s.queue = append(s.queue, e)
				return nil
			}); ferr != nil {
				s.err = ferr
			}
		}
		switch {
		case s.err != nil:
		case errors.Is(err, io.EOF):
			s.r.End()
			s.err = io.EOF
		case err != nil:
			s.err = err
		}
	}
	e := s.queue[0]
	s.queue = s.queue[1:]
	return e, nil
}

func (r *Reader) max() int {
	if r.MaxSize > 0 {
		return r.MaxSize
	}
	return DefaultMaxSize
}

// tooLong handles a line or data over the bound: ErrTooLong (kept), or
// with SkipTooLong nil and the current event marked for dropping.
func (r *Reader) tooLong() error {
	if !r.SkipTooLong {
		r.err = ErrTooLong
		return r.err
	}
	r.broken = true
	return nil
}

// keep buffers the unfinished tail of a line. Of a line over the bound
// only its first MaxSize bytes are kept (Line.Truncated).
func (r *Reader) keep(p []byte) error {
	if r.skipLine {
		return nil
	}
	if len(r.line)+len(p) > r.max() {
		if err := r.tooLong(); err != nil {
			return err
		}
		r.skipLine, r.line = true, append(r.line, p[:r.max()-len(r.line)]...)
		return nil
	}
	r.line = append(r.line, p...)
	return nil
}

// lineEnd is the index of the first CR or LF in p, -1 if none.
func lineEnd(p []byte) int {
	lf := bytes.IndexByte(p, '\n')
	head := p
	if lf >= 0 {
		head = p[:lf]
	}
	if cr := bytes.IndexByte(head, '\r'); cr >= 0 {
		return cr
	}
	return lf
}

// processLine interprets one line, without its line end; end is the
// offset just past its line end's first byte.
func (r *Reader) processLine(line []byte, end int64, emit func(Event) error) error {
	if len(line) == 0 {
		return r.dispatch(end, emit)
	}
	if line[0] == ':' {
		return nil // a comment
	}
	if !utf8.Valid(line) {
		r.fixed = appendValidUTF8(r.fixed[:0], line)
		line = r.fixed
	}
	field, value := line, []byte(nil)
	if c := bytes.IndexByte(line, ':'); c >= 0 {
		field, value = line[:c], line[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "data":
		if r.broken {
			return nil
		}
		if len(r.data)+len(value)+1 > r.max() {
			r.data = r.data[:0]
			return r.tooLong()
		}
		r.data = append(append(r.data, value...), '\n')
	case "event":
		if string(value) != r.eventType {
			r.eventType = string(value)
		}
	case "id":
		if bytes.IndexByte(value, 0) < 0 && string(value) != r.lastID {
			r.lastID = string(value)
		}
	case "retry":
		if len(value) > 0 && allDigits(value) {
			if ms, err := strconv.ParseInt(string(value), 10, 64); err == nil {
				r.retry, r.hasRetry = ms, true
			}
		}
	}
	return nil
}

// dispatch ends the event being built: it is emitted when its data buffer
// is not empty (and it stayed within the bound).
func (r *Reader) dispatch(end int64, emit func(Event) error) error {
	data, typ, broken := r.data, r.eventType, r.broken
	r.data, r.eventType, r.broken = r.data[:0], "", false
	if broken || len(data) == 0 {
		return nil
	}
	if typ == "" {
		typ = "message"
	}
	return emit(Event{Type: typ, Data: data[:len(data)-1], ID: r.lastID, End: end})
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// appendValidUTF8 appends s to dst with each maximal subpart of an
// ill-formed sequence replaced by U+FFFD, as the WHATWG Encoding
// standard's UTF-8 decoder does.
func appendValidUTF8(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			dst = append(dst, s[i])
			i++
			continue
		}
		if c, size := utf8.DecodeRune(s[i:]); c != utf8.RuneError || size > 1 {
			dst = append(dst, s[i:i+size]...)
			i += size
			continue
		}
		i += maximalSubpart(s[i:])
		dst = append(dst, "\uFFFD"...)
	}
	return dst
}

// maximalSubpart is the length of the ill-formed sequence at the start of
// s: its lead byte and the continuation bytes that could still have
// completed it (WHATWG Encoding, "UTF-8 decoder": bytes needed and the
// bounds of the next byte).
func maximalSubpart(s []byte) int {
	var need int
	lower, upper := byte(0x80), byte(0xBF)
	switch b := s[0]; {
	case b >= 0xC2 && b <= 0xDF:
		need = 1
	case b == 0xE0:
		need, lower = 2, 0xA0
	case b == 0xED:
		need, upper = 2, 0x9F
	case b >= 0xE1 && b <= 0xEF:
		need = 2
	case b == 0xF0:
		need, lower = 3, 0x90
	case b == 0xF4:
		need, upper = 3, 0x8F
	case b >= 0xF1 && b <= 0xF3:
		need = 3
	default:
		return 1
	}
	n := 1
	for ; n <= need && n < len(s); n++ {
		if s[n] < lower || s[n] > upper {
			break
		}
		lower, upper = 0x80, 0xBF
	}
	return n
}
