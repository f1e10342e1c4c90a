// Package sim is a backend model-server simulator: an HTTP server that
// speaks the real wire format of an Ollama server or of an
// OpenAI-compatible server (vLLM, llm-d) and answers with deterministic
// made-up text. It stands in for real model servers in tests, benchmarks
// and `iop dev`, in the spirit of llm-d-inference-sim.
//
// # What it serves
//
// With Protocol "ollama" (ollamaRoutes; docs.ollama.com/api):
//
//	POST /api/chat        NDJSON stream (default) or one JSON object
//	POST /api/generate    same, with "response" instead of "message"
//	POST /api/embed       {"model","embeddings":[[...]],"prompt_eval_count"}
//	POST /api/embeddings  legacy single-prompt form {"embedding":[...]}
//	GET  /api/tags, /api/ps, /api/version; POST /api/show; GET /
//
// With Protocol "openai" (openaiRoutes; the /v1 prefix is optional):
//
//	POST /v1/chat/completions  chat.completion or SSE chunks
//	POST /v1/completions       text_completion objects or SSE chunks
//	POST /v1/embeddings        {"object":"list","data":[...]}
//	GET  /v1/models, /v1/models/{model}
//
// GET /stats reports the counters and the prefix cache (Stats).
//
// # What lives where
//
//   - config.go: Config, Faults (the injected failures), Validate.
//   - server.go: Server, New, Serve, Start, Stats, Seen.
//   - models.go: the served models (AddModel, RemoveModel, lookup).
//   - generate.go: the answer (complete, applyStop, completeChoice,
//     embed), its pacing (pace) and the tokenizer (countWords).
//   - tools.go: the tool-call rule (chooseTool, toolChoice, makeToolCall).
//   - thinking.go: reasoning tokens (ollamaThinking, openaiThinking).
//   - format.go: answers to a request for JSON (structuredAnswer).
//   - cache.go: a vLLM-like prefix (KV) cache (prefixCache).
//   - residency.go: models load on demand, as Ollama's do
//     (Config.MaxLoadedModels, LoadTime; LRU eviction of an idle one;
//     unload on a prompt-less request with keep_alive 0).
//   - ollama.go, openai.go: the two protocols' handlers and shapes.
//
// # Invariants
//
//   - The same prompt, model and seed always get the same answer.
//   - A token is a whitespace-separated word (countWords).
//   - A request naming a model not served (any more) is answered 404.
//   - Each admitted request holds one in-flight slot, released once.
//   - Injected faults are deterministic in Config.Seed and request order.
//
// # Concurrency
//
// A Server is safe for concurrent use; net/http calls its handler on one
// goroutine per request. Configuration, clock, logger and routes are set
// in New and never written again.
//
// Server.mu guards the served models, the counters, the prefix cache, the
// loaded models and the record of seen requests; a load ends in a clock
// callback that takes it. Handlers write the counters and the record
// under it; Stats and Seen copy them out under it. AddModel and
// RemoveModel replace model entries, never modify one. No lock is held
// while a handler waits on the clock or writes to the network.
//
// The handler admitted to an in-flight slot releases it exactly once, in
// a deferred call, on every path out: answer written, client gone,
// injected fault, dropped connection (panic(http.ErrAbortHandler)).
//
// Serve runs http.Server.Serve on one goroutine and returns when its
// context is done and the server has shut down. That context is every
// request's base context, so cancelling it ends hung requests. Start runs
// Serve on a goroutine of its own, which its stop function waits for; a
// server stopped and started again on its address stands in for a model
// server that goes down and comes back.
package sim
