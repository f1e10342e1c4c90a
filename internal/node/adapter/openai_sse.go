package adapter

import (
	"bytes"
	"encoding/json"

	"iop/internal/sse"
)

// maxWatchedEvent is how much of one SSE event errorWatch keeps to look
// at. An error event is small; a longer event is a chunk of output, not
// one.
const maxWatchedEvent = 64 << 10

// errorWatch reads a relayed Server-Sent Events body, as the chunks go by,
// for an error event: one whose data is a JSON object with a non-null
// "error" member, as vLLM, SGLang and OpenAI send when a stream fails
// after its 200 (`data: {"error":{"message":...}}`), and for the closing
// `data: [DONE]`. It only watches: the bytes are relayed unchanged
// whatever it finds. The events are read by package sse (the WHATWG rules:
// any line end, split reads, one optional space after "data:", an event
// dispatched by its blank line; one the body ends without is discarded,
// as a client would). The zero value is ready to use.
type errorWatch struct {
	events sse.Reader
	// message is the text of the first error event seen, "" if none.
	message string
	// seen counts the events seen; firstError is set when the first
	// of them was an error event.
	seen       int
	firstError bool
	// done: a `data: [DONE]` event was seen, the end OpenAI's streams
	// promise; a body that ends without it was cut short.
	done bool
}

// write looks at the next chunk of the body.
func (w *errorWatch) write(p []byte) {
	if w.events.MaxSize == 0 {
		w.events.MaxSize, w.events.SkipTooLong = maxWatchedEvent, true
	}
	// With SkipTooLong, Feed fails only with the callback's error: never.
	_ = w.events.Feed(p, func(e sse.Event) error {
		w.event(e.Data)
		return nil
	})
}

// event checks one event's data.
func (w *errorWatch) event(data []byte) {
	w.seen++
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		w.done = true
		return
	}
	if w.message != "" {
		return
	}
	if len(data) == 0 || data[0] != '{' || !bytes.Contains(data, []byte(`"error"`)) {
		return // the cheap test first: chunks of output are never parsed
	}
	var event struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(data, &event) != nil {
		return
	}
	if msg := errorText(event.Error); msg != "" {
		w.message, w.firstError = msg, w.seen == 1
	}
}
