// Package httpconn holds the pieces of the edge's HTTP serving that belong
// to the connection and not to any API: a request body capped, decoded and
// lingered on, and read whole; a response writer that gives every write a
// fresh write deadline and records what was sent; a JSON or text answer.
// The frame (package edge/api) wraps every request in Body and Writer
// before it routes it; the API packages read bodies and write answers
// with the rest. Nothing here knows a route or a model.
//
// # Map
//
//   - body.go: Body, a request body capped at a limit
//     (http.MaxBytesReader), decoded when it has a Content-Encoding
//     (package bodycoding), with a read deadline lifted at its end, and
//     Body.Linger, the read-and-discard of what a client still sends after
//     an early answer (RFC 9112 §9.6). EncodingError is a body in a coding
//     the edge does not decode (the frame answers it 415).
//   - writer.go: Writer, the response writer: writes in pieces of
//     16 KiB, each after a fresh write deadline; records whether anything
//     was written and the status sent.
//   - read.go: ReadBody, ReadJSONBody, BodyError: a body read whole, its
//     failures as ErrBodyTooLarge (413), ErrBodyTimeout (408),
//     ErrUnsupportedMedia (415), *EncodingError (415) or a
//     *request.FieldError (400), which the frame's Classify answers.
//   - answer.go: WriteJSON, WriteJSONAs, WriteText (with Content-Length,
//     so a lingering read does not hold the answer); SentStatus.
//   - header.go: IsHopHeader, the response headers of a connection rather
//     than of an answer (not relayed); ClientGone.
//
// # Concurrency
//
// A Body and a Writer belong to the goroutine serving their request; no
// method is safe for concurrent use. Nothing here starts a goroutine.
package httpconn
