// Package api is the edge's OpenAI- and Ollama-compatible HTTP API: it
// decodes a client's request, turns it into one Dispatch call on the edge
// service (the Gateway interface), and renders what the node sends back into
// the client's wire format (OpenAI API reference,
// platform.openai.com/docs/api-reference; Ollama API doc, docs/api.md of
// github.com/ollama/ollama). An Ollama request is first translated into a
// canonical OpenAI body (package translate) and dispatched like an OpenAI
// one; its answer, run events or the tunnel's OpenAI bytes, is rendered as
// Ollama NDJSON or JSON (ollama_render.go).
//
// # Routes
//
//	POST /v1/chat/completions  chat.completion, or SSE chat.completion.chunk events ending "data: [DONE]"
//	POST /v1/completions       text_completion, or SSE text_completion chunks ending "data: [DONE]"
//	POST /v1/embeddings        {"object":"list","data":[{"object":"embedding","index","embedding"}],"model","usage"}
//	GET  /v1/models            {"object":"list","data":[{"id","object":"model","created","owned_by":"iop"}]}
//	GET  /v1/models/{model}    one model object, or 404 model_not_found
//	GET  /admin/v1/nodes       JSON array of connected nodes (only when the Gateway implements Admin, else 404)
//	GET  /admin/v1/providers   JSON array of provider snapshots
//	GET  /admin/v1/queues      JSON array of model queues: policy and queued
//	POST /api/chat             Ollama chat: NDJSON lines ending with a done object, or one object ("stream": false)
//	POST /api/generate         Ollama generate: the same, with "response" instead of "message"
//	POST /api/embed            Ollama embeddings: {"model","embeddings":[[...]],"total_duration","load_duration","prompt_eval_count"}
//	POST /api/embeddings       Ollama's older embeddings API: {"embedding":[...]}
//	GET  /api/tags             {"models":[...]}: the names of /v1/models
//	GET  /api/ps               {"models":[...]}: served models with runs in flight (Gateway implementing ModelCatalog)
//	POST /api/show             what the catalog knows of one model, in Ollama's shape
//	GET  /api/version          {"version":"0.12.0"}, the Ollama API version followed
//	GET  /                     "Ollama is running" (clients probe it)
//	GET  /healthz              200 "ok" while the process serves HTTP
//	GET  /readyz               200 "ready" when Config.Ready reports true, else 503
//
// Any other path is answered 404 and a known path with another method 405,
// both in the OpenAI error shape {"error":{"message","type","param","code"}},
// or, under /api/ and at /, in Ollama's {"error":"..."}. Ollama model names
// "x" and "x:latest" name one model.
//
// # Execution paths
//
// A run's DispatchInfo.Path says how its answer travels back. On the tunnel
// path the node relays the provider's HTTP response unchanged: TunnelHead
// becomes the status line and headers, each TunnelData is written and flushed
// as it arrives. On the normalized path the node sends run events (started,
// delta, usage, complete, error, cancelled) that this package renders as a
// chat.completion, text_completion or embeddings list object, or as SSE
// chunks; tool calls in deltas become message.tool_calls, or streamed
// delta.tool_calls parts, and embeddings with encoding_format base64 are
// encoded here.
//
// # Errors
//
// Every failure is mapped to an HTTP status and an OpenAI error body by one
// function, classify (errors.go). The Gateway reports dispatch outcomes by
// wrapping this package's sentinel errors (ErrUnknownModel, ErrQueueFull, ...);
// the edge's adapter maps its own and the scheduler's errors onto them. A
// failure after the response headers were sent cannot change the status: an
// SSE stream then ends with one `data: {"error":{...}}` event and no
// `data: [DONE]`, and any other body is cut off by aborting the connection,
// so a client never mistakes a failed answer for a complete one.
//
// Nothing more is written once the request's context ends (the client has
// gone away), and the connection is aborted (http.ErrAbortHandler) instead
// of letting net/http end the exchange: a handler that wrote nothing would
// otherwise become an empty "200 OK", and a started body would end cleanly.
// This matters for a client that half-closes its connection after sending
// the request: net/http cancels the context on that EOF, yet the client is
// still reading (ServeHTTP).
//
// Client-provided text quoted in an error message or a log line (a model
// name, a path, a field's value) is clipped to 256 bytes (clip).
//
// # Concurrency
//
// The handler returned by New is safe for concurrent use; net/http calls it on
// one goroutine per request, and its configuration, gateway and logger are set
// in New and never written again.
//
// Each dispatched run is owned by the request goroutine that dispatched it,
// which is the only caller of Run.Recv and the only writer of the response.
// Run.Close is called exactly once per run, through a sync.Once: either by the
// request goroutine's deferred cleanup when the handler ends (completion,
// upstream failure, write failure), or first by a context.AfterFunc callback
// when the request's context ends (client gone). That callback runs on a
// goroutine of its own; closing the run makes a blocked Recv return, so the
// request goroutine notices a departed client promptly. The cleanup stops the
// callback before the handler returns, and the Once makes the two callers
// race-free. No goroutine outlives its request.
package api
