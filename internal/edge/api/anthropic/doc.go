// Package anthropic is Anthropic's Messages API on the edge's HTTP API
// frame (package api): POST /v1/messages, POST /v1/messages/count_tokens,
// and GET /v1/models and /v1/models/{model} in Anthropic's shape to a
// request that names an anthropic-version. Routes registers them
// (api.Config.APIs); errors under /v1/messages are Anthropic's
// ({"type":"error","error":{...}}, anthropicError).
//
// # Where things live
//
//	messages.go  Routes; POST /v1/messages (translated by package translate), count_tokens, the error mapping
//	render.go    messagesRender: a run rendered as one message or Anthropic's event stream
//	ping.go      pingRun: a quiet stream's ping events
//	models.go    the Models API's shape: a page of models, one model
//
// # Invariants
//
//   - A streamed answer sends a ping after each messagesPingInterval of
//     quiet, from the request's start (also while it is queued).
//   - A started stream that fails ends with one error event and no
//     message_stop.
//
// # Concurrency
//
// The request goroutine owns the answer, as in package api. A streamed
// answer's run is received on pingRun's goroutine, which only hands
// messages to the request goroutine; stop cancels the run and waits for
// that goroutine before the run is closed.
package anthropic
