package stream

import (
	"bytes"

	"iop/internal/sse"
)

// FinalHold is the one reader of a relayed tunnel answer's body: each
// chunk is fed to it once (Split), as it arrives, and it both decides what
// may be written now and tells the answer's observers what the body says.
//
// It holds back the end of the answer until the run's terminal message
// arrives (the tunnel's end event), so that the key's request slot is
// given back before the client can see the answer end: the provider's
// last bytes come before the tunnel's end event, and a client reading
// them could otherwise send its next request while this one still counts.
// What is held is exactly what tells a client the answer is complete:
//   - an event stream (SSE): from the start of the line that ends it,
//     `data: [DONE]` (OpenAI's end of stream) or an error event
//     `data: {"error"...` (which ends a stream that failed), to the end,
//     and, while undecided, a partial line that may still become one of
//     them;
//   - any other body (a JSON answer): its last non-blank byte and what
//     follows it (a JSON document is incomplete without its last byte).
//
// Everything else passes at once, so no content event waits: an SSE event
// is dispatched by the client only at its blank line, which a held partial
// line does not have yet. The relayed bytes are never changed: what Split
// returns followed by Rest is what was fed, in order.
//
// An event stream is parsed once, by one sse.Reader (the WHATWG rules),
// whose lines tell where the held part starts and whose events, each read
// once (ReadEvent: content, usage), go to Observer at once, held or not
// (the metrics and the usage ledger count what the provider sent), and to
// Record once the bytes that complete them are released (Split's result
// or Rest's): the runs API records what a client would have got, so the
// held end of a run that fails instead is never recorded. A line is judged
// as it came: the first line after a byte order mark is not an end (the
// OpenAI clients iop relays to do not drop a BOM), and a line over the
// reader's bound (MaxScanBytes) by its first MaxScanBytes bytes. One
// goroutine uses a FinalHold.
type FinalHold struct {
	// SSE is set when the body is an event stream; set before the first
	// Split.
	SSE bool
	// Observer, if set, is told of each event as it is read and of a JSON
	// body's bytes.
	Observer Observer
	// Record, if set, is told of each event once it is released; the
	// event's Data is valid only during the call.
	Record func(Event)

	events sse.Reader // an event stream's one reader
	held   []byte     // the bytes fed but not yet returned
	// scratch holds held+p while Split looks at them; what Split returns
	// may point into it, until the next call.
	scratch []byte
	// passed is the number of bytes Split returned so far: the offset in
	// the stream of held's first byte.
	passed int64
	// final is set once an SSE line ending the stream was seen, at offset
	// finalAt: every later byte is held too.
	final   bool
	finalAt int64
	// sawLine is set once the reader passed the stream's first line.
	sawLine bool
	// pending are the events read from held bytes, not yet told to Record.
	pending []Event
}

// Observer is told what a relayed tunnel answer says, as its one reader
// reads it.
type Observer interface {
	// TunnelEvent is told of each event of an event stream as it is read;
	// ev.Data is valid only during the call.
	TunnelEvent(ev *Event)
	// TunnelBody is given the bytes of a body that is not an event stream,
	// as they arrive; p is valid only during the call.
	TunnelBody(p []byte)
}

// Split takes the next relayed bytes and returns those to write now (valid
// until the next call); the rest is kept for Rest.
func (f *FinalHold) Split(p []byte) []byte {
	wasFinal := f.final
	if f.SSE {
		f.read(p)
	} else if f.Observer != nil {
		f.Observer.TunnelBody(p)
	}
	if wasFinal {
		f.held = append(f.held, p...)
		return nil
	}
	buf := p
	if len(f.held) > 0 {
		f.scratch = append(append(f.scratch[:0], f.held...), p...)
		buf = f.scratch
	}
	var cut int // where the held part starts, in buf
	if f.SSE {
		cut = int(f.sseCut() - f.passed)
	} else {
		cut = max(lastNonBlank(buf), 0) // only blanks so far (-1): hold them with what ends the body
	}
	f.passed += int64(cut)
	f.held = append(f.held[:0], buf[cut:]...)
	return buf[:cut]
}

// Rest returns the held bytes and forgets them; the events they complete
// are told to Record.
func (f *FinalHold) Rest() []byte {
	for _, ev := range f.pending {
		f.Record(ev)
	}
	f.pending = nil
	p := f.held
	f.held = nil
	f.passed += int64(len(p))
	return p
}

// Fed is the number of bytes of an event stream its reader was fed, as
// the reader counted them (sse.Reader.Fed): each byte Split took, once.
func (f *FinalHold) Fed() int64 { return f.events.Fed() }

// read feeds the next bytes of an event stream to the reader, once.
func (f *FinalHold) read(p []byte) {
	if f.events.MaxSize == 0 {
		f.events.MaxSize, f.events.SkipTooLong = MaxScanBytes, true
	}
	// With SkipTooLong, FeedLines fails only with the callback's error:
	// never.
	_ = f.events.FeedLines(p, f.line, f.event)
}

// line is told of each line of the stream before it is interpreted: the
// first that ends the stream starts the held part.
func (f *FinalHold) line(l sse.Line) {
	afterBOM := !f.sawLine && l.Start > 0 // only a BOM comes before the first line
	f.sawLine = true
	if !f.final && !afterBOM && endsStream(l.Text) {
		f.final, f.finalAt = true, l.Start
	}
}

// event reads one event of the stream, once, for Observer and Record.
func (f *FinalHold) event(e sse.Event) error {
	if f.Observer == nil && f.Record == nil {
		return nil
	}
	ev := ReadEvent(e.Data)
	if f.Observer != nil {
		f.Observer.TunnelEvent(&ev)
	}
	switch {
	case f.Record == nil:
	case f.final && e.End > f.finalAt: // completed by held bytes
		ev.Data = bytes.Clone(ev.Data)
		f.pending = append(f.pending, ev)
	default:
		f.Record(ev)
	}
	return nil
}

// sseCut returns the offset in the stream where the held part starts,
// from what the reader found: the start of the first line that ends the
// stream, else of the unterminated last line if that may still become
// one, else the end of the bytes fed.
func (f *FinalHold) sseCut() int64 {
	if f.final {
		return f.finalAt
	}
	cut := f.events.Fed()
	if l := f.events.Pending(); len(l.Text) > 0 && (f.sawLine || l.Start == 0) && mayEndStream(l.Text) {
		cut = l.Start
	}
	// A line judged not to end the stream never turns into one, so the
	// held part never starts before what was already passed.
	return max(cut, f.passed)
}

// lastNonBlank is the index of p's last byte that is not a JSON blank
// (space, tab, CR, LF), or -1.
func lastNonBlank(p []byte) int {
	i := len(p) - 1
	for i >= 0 && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n') {
		i--
	}
	return i
}

// The payloads of the SSE data lines that end a stream.
var streamEnds = [][]byte{[]byte("[DONE]"), []byte(`{"error"`)}

// endsStream reports whether a complete SSE line ends the stream: a data
// line (OpenAI writes "data: " with one space; SSE allows none or more)
// whose payload is [DONE] or starts an object with an "error" member.
func endsStream(line []byte) bool {
	payload, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return false
	}
	payload = bytes.TrimLeft(payload, " ")
	return bytes.Equal(bytes.TrimRight(payload, " "), streamEnds[0]) || bytes.HasPrefix(payload, streamEnds[1])
}

// mayEndStream reports whether an unterminated line may still turn out to
// end the stream once more bytes arrive.
func mayEndStream(part []byte) bool {
	const prefix = "data:"
	if len(part) <= len(prefix) {
		return bytes.HasPrefix([]byte(prefix), part)
	}
	if !bytes.HasPrefix(part, []byte(prefix)) {
		return false
	}
	payload := bytes.TrimLeft(part[len(prefix):], " ")
	for _, end := range streamEnds {
		n := min(len(payload), len(end))
		if bytes.Equal(payload[:n], end[:n]) {
			return true
		}
	}
	return false
}
