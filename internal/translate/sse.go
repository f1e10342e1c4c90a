package translate

import (
	"bytes"
	"errors"
)

// DefaultMaxSSELine is the longest SSE line an SSEReader accepts by default,
// in bytes (without its line end).
const DefaultMaxSSELine = 1 << 20 // 1 MiB

// ErrSSELineTooLong is returned by SSEReader.Feed for a line longer than its
// limit.
var ErrSSELineTooLong = errors.New("server-sent event line too long")

// SSEReader splits a text/event-stream body, fed in chunks of any size, into
// the data of its events, as the WHATWG HTML standard's "Interpreting an
// event stream" does (html.spec.whatwg.org, 9.2.6): lines end in CRLF, LF
// or CR (a CR at the end of one chunk and an LF at the start of the next are
// one line end); "data:" lines (one space after the colon removed, if
// present) are joined with "\n"; a blank line dispatches the event if it
// has data; comments (":...") and the fields event, id and retry are
// ignored; a leading byte order mark is skipped. Bytes are buffered until
// their line ends, so a multi-byte UTF-8 character split between chunks
// arrives whole. The zero value is ready to use, with a line limit of
// DefaultMaxSSELine. An SSEReader is used by one goroutine at a time.
type SSEReader struct {
	// MaxLine bounds one line, in bytes; 0 means DefaultMaxSSELine.
	MaxLine int

	line    []byte // the current line, not yet ended
	data    []byte // the data of the event being built
	hasData bool   // a data field was seen since the last dispatch
	afterCR bool   // the previous chunk ended in CR: skip one LF
	started bool   // some byte was seen (the BOM check is done)
}

// Feed reads p and calls emit with the data of each event it completes, in
// order. The slice passed to emit is only valid during the call. Feed
// returns emit's first error, or ErrSSELineTooLong.
func (r *SSEReader) Feed(p []byte, emit func(data []byte) error) error {
	if !r.started && len(p) > 0 {
		// A BOM may itself arrive split; buffer until 3 bytes are known.
		r.line = append(r.line, p...)
		if len(r.line) < 3 && bytes.HasPrefix([]byte("\xEF\xBB\xBF"), r.line) {
			return nil
		}
		r.started = true
		p = bytes.TrimPrefix(r.line, []byte("\xEF\xBB\xBF"))
		r.line = nil
	}
	for len(p) > 0 {
		if r.afterCR {
			r.afterCR = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			if r.tooLong(len(p)) {
				return ErrSSELineTooLong
			}
			r.line = append(r.line, p...)
			return nil
		}
		if r.tooLong(i) {
			return ErrSSELineTooLong
		}
		var line []byte
		if len(r.line) == 0 {
			line = p[:i]
		} else {
			r.line = append(r.line, p[:i]...)
			line = r.line
		}
		if p[i] == '\r' {
			r.afterCR = true
		}
		p = p[i+1:]
		err := r.processLine(line, emit)
		r.line = r.line[:0]
		if err != nil {
			return err
		}
	}
	return nil
}

// Close ends the stream: an event whose data was read but not yet ended
// by a blank line (a body cut after its last "data:" line) is emitted, more
// lenient than the standard, which discards it. Close returns emit's error.
func (r *SSEReader) Close(emit func(data []byte) error) error {
	if len(r.line) > 0 {
		line := r.line
		r.line = nil
		if err := r.processLine(line, emit); err != nil {
			return err
		}
	}
	return r.dispatch(emit)
}

func (r *SSEReader) tooLong(more int) bool {
	limit := r.MaxLine
	if limit <= 0 {
		limit = DefaultMaxSSELine
	}
	return len(r.line)+more > limit
}

// processLine handles one complete line (without its line end).
func (r *SSEReader) processLine(line []byte, emit func([]byte) error) error {
	if len(line) == 0 {
		return r.dispatch(emit)
	}
	if line[0] == ':' {
		return nil // a comment
	}
	field, value, found := bytes.Cut(line, []byte(":"))
	if found && len(value) > 0 && value[0] == ' ' {
		value = value[1:]
	}
	if string(field) != "data" {
		return nil // event, id, retry and unknown fields
	}
	if r.hasData {
		r.data = append(r.data, '\n')
	}
	r.data = append(r.data, value...)
	r.hasData = true
	return nil
}

// dispatch emits the event being built, if it has data, and starts a new one.
func (r *SSEReader) dispatch(emit func([]byte) error) error {
	if !r.hasData {
		return nil
	}
	r.hasData = false
	data := r.data
	r.data = r.data[:0]
	return emit(data)
}
