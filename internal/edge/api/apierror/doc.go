// Package apierror is the OpenAI error answer every route of the edge's
// HTTP API starts from: an HTTP status, an optional Retry-After and the
// body's fields. The frame's Classify (package edge/api) makes one of
// every failure; an API whose errors have another shape (Anthropic's,
// Ollama's) reshapes it. Nothing here decides which failure gets which
// status: that is Classify's one mapping.
//
// # Map
//
//   - error.go: Error (status, Retry-After, message, type, param, code),
//     New; Body, the {"error":{...}} shape; JSON, a body with no param;
//     the Retry-After values of back-pressure.
//
// # Concurrency
//
// An Error is built by one goroutine and read after; nothing here holds
// state or starts a goroutine.
package apierror
