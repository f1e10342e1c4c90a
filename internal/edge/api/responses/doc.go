// Package responses is OpenAI's Responses API on the edge's HTTP API
// frame (package api): POST /v1/responses, GET and DELETE
// /v1/responses/{id}, GET /v1/responses/{id}/input_items and POST
// /v1/responses/{id}/cancel. Routes(Config) makes it an api.API for
// api.Config.APIs, with the store of its responses (package
// iop/internal/responses), the runs manager its background responses run
// in, and the secret reasoning items are sealed under. Its errors are
// OpenAI's (api.Frame.WriteError).
//
// # Where things live
//
//	responses.go         Routes; create (translated by package translate), get, delete, input_items, cancel; background runs
//	responses_render.go  responsesRender: a run rendered as one response object or the Responses event stream, and stored
//	responses_events.go  responseEventLog: a background response's events, for GET ...?stream=true
//	responses_runlog.go  responseRunLog: a background response's answer in its run (the runs API)
//	reasoning_seal.go    reasoningSeal: reasoning items' encrypted_content
//
// # Invariants
//
//   - A stored response is saved before its final event or body is
//     written, and the key's request slot is given back only after that
//     save (api.Answer.KeepSlot, access.AnswerFinished).
//   - A started stream that fails ends with response.failed, never with
//     response.completed.
//
// # Concurrency
//
// The request goroutine owns the answer, as in package api; a background
// response is owned by its runs.Run goroutine (api.Frame.ServeDetached).
// server.streaming (sync.Map) is written by the streaming request and
// read by GET and DELETE of others; DELETE cancels and waits on done. A
// responseEventLog has one writer (the run's goroutine) and followers
// that read it under its mutex.
package responses
