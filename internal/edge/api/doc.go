// Package api is the edge's OpenAI- and Ollama-compatible HTTP API: it
// decodes a client's request, turns it into one Dispatch call on the edge
// service (the Gateway interface), and renders what the node sends back into
// the client's wire format (OpenAI API reference,
// platform.openai.com/docs/api-reference; Ollama API doc, docs/api.md of
// github.com/ollama/ollama; Anthropic API reference,
// docs.anthropic.com/en/api/messages). An Ollama or an Anthropic Messages
// request is first translated into a canonical OpenAI body (package
// translate) and dispatched like an OpenAI one; its answer, run events or
// the tunnel's OpenAI bytes, is rendered as Ollama NDJSON or JSON
// (ollama_render.go) or as a Messages answer or event stream
// (messages_render.go).
//
// An OpenAI route parses the client's body once (parseBody, jsonvalue.go:
// one pass, values pointing into the body): its checks, its needs, its
// estimated input tokens and the removal of an iop_ollama member all read
// that parse, and no part of the body is decoded again. An Ollama route's
// body is decoded once, by its translation; the checks, needs and estimate
// come from what the translation decoded (ollamaChatNeeds,
// checkOllamaEmbed), never from decoding the canonical body it generated
// (the client's tools, which the translation passes on unread, are parsed
// once there).
//
// # Routes
//
//	POST /v1/chat/completions  chat.completion, or SSE chat.completion.chunk events ending "data: [DONE]"
//	POST /v1/completions       text_completion, or SSE text_completion chunks ending "data: [DONE]"
//	POST /v1/embeddings        {"object":"list","data":[{"object":"embedding","index","embedding"}],"model","usage"}
//	POST /v1/responses         OpenAI's Responses API: a response object, or its SSE event stream (responses.go)
//	GET  /v1/responses/{id}    a stored response (Config.Responses), of the request's key only; DELETE removes it
//	GET  /v1/responses/{id}/input_items  {"object":"list","data","first_id","last_id","has_more"}
//	POST /v1/responses/{id}/cancel       cancels a background response
//	GET  /v1/models            {"object":"list","data":[{"id","object":"model","created","owned_by":"iop"}]}
//	GET  /v1/models/{model}    one model object, or 404 model_not_found
//	POST /v1/messages          Anthropic's Messages API: a message object, or its event stream (messages.go)
//	POST /v1/messages/count_tokens  {"input_tokens": the edge's estimate}
//	POST /api/chat             Ollama chat: NDJSON lines ending with a done object, or one object ("stream": false)
//	POST /api/generate         Ollama generate: the same, with "response" instead of "message"
//	POST /api/embed            Ollama embeddings: {"model","embeddings":[[...]],"total_duration","load_duration","prompt_eval_count"}
//	POST /api/embeddings       Ollama's older embeddings API: {"embedding":[...]}
//	GET  /api/tags             {"models":[...]}: the names of /v1/models with their tag ("demo:latest"), with what their model server said of them
//	GET  /api/ps               {"models":[...]}: what the providers hold loaded (Config.Catalog)
//	POST /api/show             the serving Ollama's own answer (Config.Shower), else iop's view in Ollama's shape
//	POST /api/pull             Ollama's progress stream for a model iop serves (nothing is downloaded), Ollama's error for another
//	GET  /api/version          {"version":"0.17.4"}, the Ollama API version followed
//	GET  /                     "Ollama is running" (clients probe it)
//	GET  /metrics              the Prometheus exposition (only when Config.Metrics is set)
//	GET  /healthz              200 "ok" while the process serves HTTP
//	GET  /readyz               200 "ready" when Config.Ready reports true, else 503
//	Config.Routes              the routes of the API packages: /admin/v1/... and /ui (package admin)
//
// Any other path is answered 404 and a known path with another method 405,
// both in the OpenAI error shape {"error":{"message","type","param","code"}},
// or, under /api/ and at /, in Ollama's {"error":"..."}, or, under
// /v1/messages, in Anthropic's {"type":"error","error":{"type","message"}}
// with its statuses (anthropicError: 529 overloaded_error for a full
// queue or a queue timeout). Ollama model names
// "x" and "x:latest" name one model.
//
// # Keys
//
// With client keys configured (Config.Keys), every route but /healthz and
// /readyz needs one, as "Authorization: Bearer KEY" or "x-api-key: KEY";
// routes under Config.AdminPrefixes (/admin, /metrics, /ui, /debug) need an
// admin key (Config.AdminKeys) whenever any key is configured. A missing
// or unknown key is answered 401 with WWW-Authenticate: Bearer, a key of
// the other class 403. A POST that runs a model first takes one of its
// key's request slots (max_concurrent, requests_per_minute): over either,
// 429 with Retry-After before anything is queued. A model the key may not
// use is 403 model_not_allowed, and the model listings show only the
// key's models. The caller is never part of the dispatched Request, so it
// cannot influence provider selection (access.go). A refusal by a key's
// limits is a finished request like any other: recorded once, outcome
// refused, with its error code (see Observation).
//
// The slot is given back when the answer is finished (answerFinished),
// before the answer's last byte is written, so that a client that has
// read its whole answer never meets its own max_concurrent with its next
// request: "finished" means the request occupies no provider any more,
// that is its run has ended at the edge (Run.Recv returned the run's
// message that ends it or an error, by then the lease is released; or the
// handler cancelled the run itself) or it was never dispatched. On the
// normalized path every final write follows that message. On the
// tunnel path the provider's last bytes come before the tunnel's end event,
// so the bytes that end the answer (an event stream's `data: [DONE]` or
// error event, a JSON body's last byte) are held back until it arrives
// (finalHold, tunnelhold.go). An error answer gives it back before it is
// written. A run of the runs API gives back its submission's slot before
// its last event and its final record (the synchronous POST answers after
// that). A client that goes away gives it back when the handler returns.
//
// # Usage ledger
//
// With Config.Ledger, every finished API request is recorded once, from
// its RequestRecord, when it ends (finish): request id, key name, model,
// node, provider, the usage the provider reported, duration, outcome and
// error code.
//
// # Execution paths
//
// A run's contract.DispatchInfo.Path says how its answer travels back. Run.Recv
// hands on each of the node's messages as the edge decoded it, once, into
// the contract's typed events (contract.Message; whether it ends the run
// is the edge's decision, Message.Ends): this package never reads the wire
// protocol. On the tunnel path the node relays the provider's HTTP response
// unchanged: its head event becomes the status line and headers, each data
// event is written and flushed as it arrives; a small non-streamed answer
// comes as one message (a head with the whole body and its end:
// contract.TunnelParts), written with one flush and a Content-Length, and
// so does a larger one whose head declared its length (else it is
// chunked). On the normalized path the
// node sends run events (delta, usage, end, failure) that this package renders as a
// chat.completion, text_completion or embeddings list object, or as SSE
// chunks; tool calls in deltas become message.tool_calls, or streamed
// delta.tool_calls parts, a delta's thinking becomes reasoning_content
// (message or delta; render.go says why that name), and embeddings with
// encoding_format base64 are encoded here. For Ollama clients a tunnel
// answer's reasoning_content or reasoning becomes thinking.
//
// # Runs API
//
// A run of the runs API (/v1/runs, runs.go; served with Config.Runs) is a
// chat completion that lives in a runs.Run. It is not served by the chat
// route: execute (runexec.go) dispatches its chat request itself
// (Gateway.Dispatch, with the run's id and its session's preferred node
// and provider) and consumes the run's typed events (contract.Message)
// directly into the run (runRecorder): on the normalized path each delta's
// reasoning, text and tool-call parts, the finish reason and the usage
// become the chat.completion.chunk events a streaming chat client gets
// (rendered once, appended to the run's log, the text to its output); on
// the tunnel path the provider's OpenAI chat-completions bytes are read
// once, by the same one reader as on the chat route (finalHold), and each
// event the chat route would have released is recorded with its data as
// the provider sent it (its output text, finish reason and error read
// from that event, its usage as the observation read it). The run's request is observed as an API request of
// operation "runs" (its outcome, log line, metrics and ledger entry
// decided as on the chat route), and a refusal by the gateway reaches a
// synchronous submission on a channel, to be answered as the chat route
// answers it. Nothing is rendered into an http.ResponseWriter and read
// back.
//
// # Responses API
//
// POST /v1/responses (responses.go, responses_render.go) is served like
// the Ollama routes: the client's body is decoded and checked once
// (translate.DecodeResponsesRequest; its Needs and estimated tokens come
// from that decode), the conversation (the items of previous_response_id,
// then the input, item references resolved against the key's stored
// items) is translated into a canonical chat completions body
// (ResponsesRequest.ChatBody), dispatched through serveRunWith as every
// chat request is, and the answer, run events or the tunnel's OpenAI chat
// answer, is rendered as a response object or the Responses event stream
// by a translate.ResponseBuilder. State is iop's: with Config.Responses,
// a response with store true (the default) is kept, with its owner (the
// key's name), before its final event or body is written; GET, DELETE,
// input_items and previous_response_id find only the key's own responses
// (another key's id is 404, as OpenAI answers an id it does not know). A
// background response (background true, with Config.Runs) runs as a run
// of the runs manager whose id is the response's; its state is saved as
// it goes, its run records its dispatch, output, usage and events as a
// POST /v1/runs run does (responseRunLog), and POST /cancel (or DELETE)
// cancels its run. A streamed stored response is saved in_progress
// before response.created and is in handler.streaming while it streams,
// so GET finds it and DELETE cancels its request (then deletes it); a
// stream that ends without its final state stored (its client left) is
// stored cancelled. A save that fails fails the request (500, or
// response.failed), and the key's slot is held until the save is done.
// A stored response keeps its own items only: the conversation is the
// chain of previous_response_id (responses.SQLite.Conversation).
//
// # Errors
//
// Every failure is mapped to an HTTP status and an OpenAI error body by one
// function, classify (errors.go). The Gateway reports dispatch outcomes by
// wrapping the contract's errors (package edge/contract: ErrUnknownModel,
// ErrQueueFull, ..., aliased here); the edge wraps the scheduler's with
// them once, at its boundary, so nothing translates between error sets. A
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
// # Observation
//
// Every API request (a route that calls observation.begin: the routes
// that run a model, and a refusal of one by its key's limits) ends with
// one RequestRecord (observe.go): its request id, key, where it went, how
// it was admitted, its status and outcome, its times and its tokens. The
// handler logs it as one line ("request", info level; warn for a 5xx or
// an upstream failure), hands it to Config.Observer (the metrics, the
// events stream's refusals) and records it in Config.Ledger. The outcome
// is decided once (observation.decide): for a dispatched request on the
// request goroutine, from how the rendering of its run ended, before the
// run is closed with it (Run.Close, which the edge publishes as the run's
// run_ended); nothing that happens after the answer, such as the client
// closing its connection, changes it. A run of the runs API records it too.
// On the tunnel path the tokens and the time to first token are read from
// the relayed bytes, which are never changed: an event stream by its one
// reader (finalHold, tunnelhold.go: each chunk parsed once, each event
// read once for the observation and a run's recorder alike, usage.go), a
// JSON body from a copy (usageScanner).
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
// which is the only caller of Run.Recv and the only writer of the response,
// but for a streamed Messages answer: its Dispatch is called on a
// goroutine of its own (dispatchQuiet, messages_ping.go), which only hands
// the run or the failure back, while the request goroutine pings the
// client each 10 s the request waits (queued, or for the provider's first
// message) and waits for that goroutine in every case; then its run's
// Recv is called by a receiving goroutine (pingRun) that hands each
// message to the request goroutine, which pings the client meanwhile
// when the run is quiet; the request goroutine stays the only writer,
// and stops that goroutine (cancelling the run, which makes a blocked
// Recv return, and waiting for it) before the run is closed.
// Run.Close is called exactly once per run, by the request goroutine's
// deferred cleanup when the handler ends, with the request's outcome. When
// the request's context ends (client gone) a context.AfterFunc callback,
// on a goroutine of its own, calls Run.Cancel: ending the run makes a
// blocked Recv return, so the request goroutine notices a departed client
// promptly; the callback decides nothing about the outcome. The cleanup
// stops the callback before the handler returns; Run.Cancel is safe
// concurrently with Recv and Close. No goroutine outlives its request,
// but for a run of the runs API: its run is dispatched, received, recorded
// and closed by the run's own goroutine (runs.Manager.Start's, execute),
// which is then its only owner as the request goroutine is of a chat
// request; the run's context ending (its submitter gone, a DELETE, the
// edge stopping) cancels it through the same context.AfterFunc. The
// observation, its outcome included, is written by the request goroutine
// only (for a run of the runs API, by the run's goroutine). A key's request slot (admit) is an auth.Permit, given back once
// however often it is released: when the answer is finished
// (answerFinished), or at the latest when the handler returns, or, for a
// background run that took it over (keepPermit), when the run's answer is
// finished or the run ends; a stored Responses answer keeps it past the
// run's end until its save is done (runResponse.keepSlot). The handler's
// streaming map (a sync.Map) is written by the streaming request's
// goroutine (added before its first save, removed after its last) and
// read by the GET and DELETE of other requests; a DELETE cancels the
// streaming request's context and waits on its done channel, closed
// after that last save. A request's span (requestSpan, Config.Tracer set)
// is part of its observation and written by the same goroutine; the edge
// service adds its queued, admitted and dispatched events on the request
// goroutine too (inside Dispatch), and the SDK's spans are safe for
// concurrent use should a background run's dispatch add to its
// submitter's span.
package api
