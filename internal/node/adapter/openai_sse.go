package adapter

import (
	"bytes"
	"encoding/json"
)

// maxWatchedLine is how much of one SSE line errorWatch keeps to look at.
// An error event is small; a longer line is a chunk of output, not one.
const maxWatchedLine = 64 << 10

// errorWatch reads a relayed Server-Sent Events body, as the chunks go by,
// for an error event: a `data:` line whose payload is a JSON object with a
// non-null "error" member, as vLLM, SGLang and OpenAI send when a stream
// fails after its 200 (`data: {"error":{"message":...}}`), and for the
// closing `data: [DONE]`. It only watches: the bytes are relayed unchanged
// whatever it finds.
//
// Lines end with LF, CRLF or a lone CR (WHATWG HTML, "Server-sent events",
// event stream interpretation), and may be split across chunks anywhere,
// also inside a UTF-8 sequence; "data:" may or may not be followed by a
// space. The zero value is ready to use.
type errorWatch struct {
	line    []byte // the current line so far, at most maxWatchedLine bytes
	long    bool   // the current line is longer than maxWatchedLine
	afterCR bool   // the previous byte was a CR: a following LF ends nothing
	// message is the text of the first error event seen, "" if none.
	message string
	// done: a `data: [DONE]` line was seen, the end OpenAI's streams
	// promise; a body that ends without it was cut short.
	done bool
}

// write looks at the next chunk of the body.
func (w *errorWatch) write(p []byte) {
	for len(p) > 0 {
		if w.afterCR && p[0] == '\n' {
			p = p[1:]
			w.afterCR = false
			continue
		}
		w.afterCR = false
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			w.keep(p)
			return
		}
		w.keep(p[:i])
		w.afterCR = p[i] == '\r'
		w.endLine()
		p = p[i+1:]
	}
}

// keep adds p to the current line, up to maxWatchedLine bytes.
func (w *errorWatch) keep(p []byte) {
	if w.long {
		return
	}
	if len(w.line)+len(p) > maxWatchedLine {
		w.long, w.line = true, w.line[:0]
		return
	}
	w.line = append(w.line, p...)
}

// endLine checks the line just ended and starts a new one.
func (w *errorWatch) endLine() {
	line, long := w.line, w.long
	w.line, w.long = w.line[:0], false
	if long || w.message != "" {
		return
	}
	payload, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok {
		return
	}
	payload = bytes.TrimPrefix(payload, []byte(" "))
	if string(bytes.TrimSpace(payload)) == "[DONE]" {
		w.done = true
		return
	}
	if len(payload) == 0 || payload[0] != '{' || !bytes.Contains(payload, []byte(`"error"`)) {
		return // the cheap test first: chunks of output are never parsed
	}
	var event struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(payload, &event) != nil {
		return
	}
	if msg := errorText(event.Error); msg != "" {
		w.message = msg
	}
}
