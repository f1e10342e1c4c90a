package api

import "bytes"

// finalHold holds back the end of a relayed tunnel answer until the run's
// terminal message arrives (the tunnel's end event), so that the key's
// request slot is given back before the client can see the answer end (answerDone): the
// provider's last bytes come before the tunnel's end event, and a client
// reading them could otherwise send its next request while this one still
// counts.
//
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
// line does not have yet. The relayed bytes are never changed: what split
// returns followed by rest is what was fed, in order. Only the request
// goroutine uses a finalHold.
type finalHold struct {
	sse  bool
	held []byte
	// scratch holds held+p while split looks at them; what split returns
	// may point into it, until the next call.
	scratch []byte
	// final is set once an SSE line ending the stream was seen: every
	// later byte is held too.
	final bool
	// midLine is set when the bytes passed so far end inside a line that
	// cannot end the stream: the next bytes continue it.
	midLine bool
}

// split takes the next relayed bytes and returns those to write now (valid
// until the next call); the rest is kept for rest.
func (f *finalHold) split(p []byte) []byte {
	if f.final {
		f.held = append(f.held, p...)
		return nil
	}
	buf := p
	if len(f.held) > 0 {
		f.scratch = append(append(f.scratch[:0], f.held...), p...)
		buf = f.scratch
	}
	var cut int // where the held part starts
	if f.sse {
		cut = f.sseCut(buf)
	} else {
		cut = max(lastNonBlank(buf), 0) // only blanks so far (-1): hold them with what ends the body
	}
	f.held = append(f.held[:0], buf[cut:]...)
	return buf[:cut]
}

// rest returns the held bytes and forgets them.
func (f *finalHold) rest() []byte {
	p := f.held
	f.held = nil
	return p
}

// sseCut returns where the held part of buf starts: the start of its
// first line that ends the stream (final is then set), else of its last,
// unterminated line if that may still become one, else len(buf). buf
// begins at the start of a line unless midLine (held bytes always begin
// one). Only the first bytes of each line are looked at; its end is found
// with bytes.IndexByte (BenchmarkTunnelRelayChunk).
func (f *finalHold) sseCut(buf []byte) int {
	start := 0
	if f.midLine {
		end := lineEnd(buf)
		if end < 0 {
			return len(buf) // still the same line
		}
		f.midLine = false
		start = end + 1
	}
	for start < len(buf) {
		end := lineEnd(buf[start:])
		if end < 0 {
			if mayEndStream(buf[start:]) {
				return start
			}
			f.midLine = true
			return len(buf)
		}
		if endsStream(buf[start : start+end]) {
			f.final = true
			return start
		}
		start += end + 1
	}
	return len(buf)
}

// lineEnd is the index of p's first line terminator (CR or LF), or -1.
func lineEnd(p []byte) int {
	n := bytes.IndexByte(p, '\n')
	limit := p
	if n >= 0 {
		limit = p[:n]
	}
	if r := bytes.IndexByte(limit, '\r'); r >= 0 {
		return r
	}
	return n
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
