// Package api is the edge's HTTP API frame. A client's request is
// decoded once, becomes
// one Gateway.Dispatch call, and the run the node sends back is rendered
// in the client's wire format. Client API packages under it register
// their routes on the frame: openai, anthropic, ollama, responses and runsapi through
// Config.APIs (they serve with the Frame), admin and batch through Config.Routes; the frame never
// imports them. Package apitest is their tests' harness; package request
// decodes and checks the request bodies (its *FieldError is answered 400
// by Classify); package stream holds the relay's stream pieces (a tunnel
// answer's one reader and usage, the chat chunk renderer), package
// bodycoding a request body's Content-Encoding.
//
// # Where things live
//
//	handler.go        New, ServeHTTP: routing, body caps and lingering, write deadlines, abort on nothing written
//	frame.go          Frame, API, Renderer, ErrorShape: what a client API package serves with; Answer's exported methods
//	frame_detached.go Frame.ServeDetached (a run with no connection), and the rest a client API package needs
//	frame_record.go   Answer.RelayRecorded, NewRunID: what the runs API records a run with
//	frame_openai.go   the Answer's relay, SSE writer, error event and embeddings vectors, for package openai
//	frame_translated.go  what an API that translates its bodies needs (ollama): any-type bodies, tunnelAnswer
//	access.go         keys, admin prefixes, a key's request slot (admit, answerFinished), model access
//	quota.go          a key's quota: reservation before queueing, clamp, settlement, rate-limit headers
//	errors.go         classify: the one mapping of every failure to a status and an OpenAI error body
//	observe.go        one RequestRecord per API request; outcome decided once (observation.decide)
//	dispatch.go       serveRun/serveRunWith: dispatch, then render by execution path
//	chat.go render.go Answer: a run rendered into an http.ResponseWriter; the tunnel relay (its reader: stream.FinalHold)
//	tracing.go        a server span per request (Config.Tracer)
//
// # Routes
//
//	GET  /v1/models, /v1/models/{model} in OpenAI's shape
//	GET  /healthz, /readyz, /metrics (Config.Metrics)
//	Config.APIs: package openai: POST /v1/chat/completions, /v1/completions, /v1/embeddings
//	Config.APIs: package anthropic: POST /v1/messages, .../count_tokens; GET /v1/models in Anthropic's shape
//	Config.APIs: package ollama: POST /api/chat, /api/generate, /api/embed, /api/show, /api/pull, ...; GET /api/tags, /api/ps, /
//	Config.APIs: package responses: POST /v1/responses; GET, DELETE /v1/responses/{id}; .../input_items; POST .../cancel
//	Config.APIs: package runsapi: POST, GET /v1/runs; GET, DELETE /v1/runs/{id}; GET .../events
//	Config.Routes: the API packages' routes (package admin: /admin/v1/..., /ui)
//
// A route's errors take its API's shape: OpenAI's, or an API's own under
// the root it registered (Frame.Errors; Anthropic's under /v1/messages)
// or on the paths it matches (Frame.ErrorsFor; Ollama's at / and under
// /api/).
//
// # Invariants
//
//   - One function maps failures to answers (classify); the Gateway's
//     errors are the contract's, wrapped with %w.
//   - A started answer that fails never ends as if complete: an SSE stream
//     gets one error event and no [DONE]; any other body is aborted.
//   - A request that wrote nothing aborts its connection (ServeHTTP).
//   - A key's slot is given back once, before the answer's last byte
//     (answerFinished), unless the renderer keeps it (Answer.KeepSlot).
//   - Every API request ends with exactly one RequestRecord; its outcome
//     is decided once and is the one Run.Close gets.
//   - A tunnel answer's bytes are relayed unchanged and read once.
//   - Client text in errors and logs is clipped to 256 bytes (clip).
//
// # Concurrency
//
// The handler is read-only after New; net/http calls it on one goroutine
// per request.
//
//   - The request goroutine owns its run: the only caller of Run.Recv and
//     Run.Close (once), and the only writer of the response and of the
//     observation.
//   - A context.AfterFunc on the request's context calls Run.Cancel when the
//     client leaves; it decides nothing.
//   - A route with Renderer.Quiet (a streamed Messages answer) dispatches
//     on a helper goroutine (dispatchQuiet); it only hands its result to
//     the request goroutine, which waits for it.
//   - A run served by Frame.ServeDetached (a runs-API run, a background
//     response) is owned by its runs.Run goroutine as a request is by its
//     goroutine.
package api
