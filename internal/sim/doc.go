// Package sim is a backend model-server simulator: an HTTP server that speaks
// the real wire format of an Ollama server or of an OpenAI-compatible server
// (vLLM, llm-d) and answers with deterministic made-up text. It stands in for
// real model servers in tests, benchmarks and `iop dev`, in the spirit of
// llm-d-inference-sim.
//
// # What it serves
//
// With Protocol "ollama" (Ollama API doc, docs.ollama.com/api):
//
//	POST /api/chat        NDJSON stream (default) or one JSON object
//	POST /api/generate    same, with "response" instead of "message"
//	POST /api/embed       {"model","embeddings":[[...]],"prompt_eval_count"}
//	POST /api/embeddings  legacy single-prompt form {"embedding":[...]}
//	GET  /api/tags, /api/ps, /api/version; POST /api/show; GET / ("Ollama is running")
//
// With Protocol "openai" (OpenAI API reference, platform.openai.com/docs/api-reference):
//
//	POST /v1/chat/completions  chat.completion or SSE chat.completion.chunk events
//	POST /v1/completions       text_completion objects or SSE chunks
//	POST /v1/embeddings        {"object":"list","data":[{"object":"embedding",...}]}
//	GET  /v1/models, /v1/models/{model}
//
// The /v1 prefix is optional on the OpenAI routes, as vLLM clients sometimes
// omit it.
//
// # Models
//
// The served models are Config.Models at first; Server.AddModel and
// Server.RemoveModel change them while the server runs, as a pull, create
// or delete changes a real server's: the listings (/api/tags, /api/ps,
// /v1/models) show the models served at the time of the request, an added
// one first (Ollama lists the most recently modified first) with a new
// digest and its time of creation, and a request naming a model not served
// (any more) is answered 404. /api/show reports each model's Ollama
// capabilities (Config.Capabilities, or DefaultCapabilities: completion,
// tools, vision, embedding). A server stopped (Start's stop function) and
// started again on the same address stands in for a model server that
// goes down and comes back.
//
// # Output
//
// Generated text is a sequence of words, each with a leading space, drawn
// from a fixed vocabulary by a PRNG seeded with (Config.Seed, hash of the
// prompt text), so the same prompt on a server with the same seed always gets
// the same answer. A prompt's token count is its number of whitespace
// separated words. Every answer has Config.DefaultMaxTokens tokens unless the
// request's limit (max_tokens, max_completion_tokens, options.num_predict)
// is lower, in which case it is cut there and the finish reason is "length".
// Stop sequences (OpenAI "stop", Ollama "options.stop") end the answer before
// the first one its text contains, as Ollama v0.17.4 and vLLM do: the stop
// sequence is not sent, the finish reason is "stop", and an OpenAI choice's
// last chunk carries vLLM's "stop_reason" with the matched sequence (left
// out when none matched). Other sampling parameters are accepted and ignored. OpenAI's "n"
// (1-128) answers that many choices, each its own text, interleaved
// token by token when streamed.
//
// # Tool calls
//
// A chat request is answered with a tool call when it defines at least one
// function tool and its last message is a user message whose text contains
// the name of one of them (the first such tool, in the order of "tools",
// is called). The arguments are a JSON object with one member per property
// of the tool's parameter schema (42 for integer and number, true for
// boolean, a word otherwise). OpenAI answers carry the call in
// message.tool_calls with finish_reason "tool_calls"; streamed, its first
// delta has index, id, type and name, and later deltas add the arguments 4
// characters at a time. Ollama answers carry the whole call in one
// message.tool_calls (arguments an object, no id) with done_reason "stop".
// An OpenAI request's tool_choice is honoured as an OpenAI-compatible
// server honours it: "none" calls no tool, "required" calls the rule's
// tool or else the first one, a named function calls that function.
//
// # Thinking
//
// With Config.Thinking (`iop sim --thinking`) the models are thinking
// (reasoning) models: an answer starts with reasoning text, words drawn
// like its text, in each protocol's real format. Ollama (as its server
// v0.17.4 does for a thinking model): the model thinks unless "think" is
// false (an unset think is true), 4, 8 or 16 tokens for "low", "medium"
// or true, and "high"; streamed, each reasoning token is an object with
// empty content and the token in message.thinking (/api/chat) or thinking
// (/api/generate), before the text; not streamed, the whole reasoning is
// there; a raw generate has none; /api/show lists the "thinking"
// capability. Without Config.Thinking, think true or a level is answered
// 400 in Ollama's words ("m" does not support thinking). OpenAI: a chat
// answer reasons by default, as a reasoning model does, for as long as
// reasoning_effort (or reasoning.effort) says, 2 tokens for "minimal" to
// 16 for "high" and "xhigh", not at all for "none"; each reasoning token
// is a delta under Config.ReasoningField ("reasoning_content", vLLM's and
// DeepSeek's name, by default, or "reasoning", Ollama's OpenAI API's and
// OpenRouter's), before the text; not streamed, the message carries it
// whole. Reasoning tokens count in eval_count and completion_tokens and
// are paced like the others; a request's token limit applies to the text
// only.
//
// # Faults
//
// Config.Faults turns on the failures a gateway must survive: a fraction of
// requests answered with an error status, streams cut off mid-way by closing
// the connection, errors reported inside a 2xx stream
// (Faults.StreamErrorAfter), and requests that are accepted and never
// answered.
//
// Config.PrefixCacheTokens gives the server a prefix (KV) cache as vLLM
// keeps one: an LRU of 16-token prompt blocks named by chained hashes, so a
// block hits only when the whole prompt up to its end was seen before, and
// Config.PrefillTokensPerSecond adds the uncached tokens' prefill to the
// time to first token. GET /stats reports the hits and misses (Stats), so a
// test sees what a router did.
//
// Config.MaxLoadedModels and Config.LoadTime make models load on demand, as
// Ollama does with OLLAMA_MAX_LOADED_MODELS: a request for a model not
// loaded waits its load time (load_duration in Ollama's answers), evicting
// the least recently used idle model at the limit (or waiting for one to be
// idle); /api/ps lists the loaded models and GET /stats counts loads and
// evictions (residency.go).
//
// # Concurrency
//
// A Server is safe for concurrent use; net/http calls its handler on one
// goroutine per request. Its configuration, clock, logger and routes are set
// in New and never written again. Server.mu guards the served models, the
// counters, the prefix cache, the loaded models and the record of seen
// requests; a load ends in a clock callback that takes it; every request handler writes
// the counters and the record, under the lock, and Stats and Seen copy them
// out under the lock; AddModel and RemoveModel replace entries of the
// served models (an entry is never modified), and handlers look them up
// or copy them under the lock. No lock is held
// while a handler waits on the clock or writes to the network.
//
// Each admitted inference request owns exactly one in-flight slot: the
// handler that was admitted releases it exactly once, in a deferred call, on
// every path out (answer written, client gone, injected fault, dropped
// connection via panic(http.ErrAbortHandler)).
//
// Serve starts one goroutine running http.Server.Serve and returns when its
// context is done and the server has shut down. The context is also every
// request's base context, so cancelling it ends hung requests and streams.
// Start runs Serve on a goroutine of its own, which its stop function waits
// for.
package sim
