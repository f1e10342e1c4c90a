// Package sse reads server-sent event streams (text/event-stream) by the
// WHATWG HTML standard's rules, "Server-sent events", 9.2.5 "Parsing an
// event stream" and 9.2.6 "Interpreting an event stream"
// (html.spec.whatwg.org/multipage/server-sent-events.html):
//
//   - the stream is UTF-8: one leading U+FEFF byte order mark is dropped,
//     invalid bytes become U+FFFD (the "UTF-8 decode" algorithm);
//   - lines end in CRLF, LF or CR;
//   - an empty line dispatches the event being built;
//   - a line starting with ':' is a comment;
//   - a line with a colon is a field (before the first colon) and its value
//     (after it, one leading space removed); a line without one is a field
//     whose value is empty;
//   - "data" appends its value and an LF to the data buffer; "event" sets the
//     event type; "id" sets the last event ID unless the value holds a NUL;
//     "retry" sets the reconnection time when the value is all ASCII digits;
//     other fields are ignored;
//   - dispatch: the last event ID is kept for this and later events; an
//     event with an empty data buffer is not dispatched; else the data's
//     last LF is removed and the event (type "message" unless "event" said
//     otherwise) is handed to the caller; the data and type start anew;
//   - at the end of the stream, an event not yet dispatched (no empty line
//     after it) is discarded.
//
// Every place iop reads an event stream uses a [Reader]: the edge's relay
// of a tunnel answer (one Reader per run, whose events the metrics, the
// usage ledger and the runs API all read, and whose lines say which bytes
// end the stream), the node's tunnel watch, the translation of an
// OpenAI-compatible provider's stream to Ollama's, and the load generator.
// Bytes may arrive split anywhere (inside a line end, a UTF-8 sequence or
// the BOM); the events are the same however they are split.
//
// A reader that must know where in the bytes something is gets offsets,
// in bytes since the stream began: [Reader.FeedLines] passes each line
// with its start before interpreting it, [Reader.Pending] says the line
// not yet ended, [Event.End] where an event ends, [Reader.Fed] how many
// bytes were fed. So a relay can hold back the line that ends a stream
// while the same one parse feeds the stream's other readers.
//
// [IsEventStream] tells a text/event-stream Content-Type from another.
//
// # Concurrency
//
// A Reader holds one stream's state and is used by one goroutine at a
// time. The package starts no goroutines.
package sse
