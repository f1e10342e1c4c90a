// Package adapter drives the model servers a node runs next to. An adapter
// takes one dispatched request (the client's OpenAI-shaped JSON body plus
// the served model name) and answers it over one of the two execution
// paths:
//
//   - normalized ([Normalizer]): the provider speaks its own protocol and
//     the adapter turns the answer into run events (started, delta, usage,
//     complete). [Ollama.Normalize] translates to Ollama's API and reads
//     its NDJSON; [CLI.Normalize] runs a command and streams its stdout.
//   - tunnel ([Tunneler]): the provider is OpenAI-compatible (OpenAI,
//     vLLM, llama.cpp server, ...). [OpenAI.Tunnel] posts the body with
//     only "model" rewritten and relays a 2xx answer's bytes unchanged,
//     once it is known not to be an error object.
//
// # What lives where
//
//   - adapter.go, errors.go: the interfaces, Request, the sinks, Error.
//   - ollama.go, ollama_stream.go, stop.go: Ollama (the normalized path).
//   - openai.go, openai_sse.go, rewrite.go, bodytext.go: OpenAI (the
//     tunnel), its header allowlist and error objects.
//   - cli.go, cli_prompt.go: CLI (a local command as a provider).
//   - redact_stream.go: the provider's key never reaches a client.
//
// # Invariants
//
//   - Nothing relayed or reported holds the provider's URL or API key.
//   - A 2xx that is an error object is a failure before the first byte.
//   - A Normalizer's last event on success is COMPLETE.
//   - Sinks are called from the calling goroutine, one call at a time.
//
// # Outcomes
//
// Every adapter method reports its outcome the same way, so the caller has one
// mapping to the wire:
//
//   - nil: the answer is complete. A Normalizer has sent COMPLETE as its last
//     event; a Tunneler has relayed the whole body (the caller sends
//     TunnelEnd, unless the sink's Head got the whole body with End: a
//     small non-streamed answer goes up as one message).
//   - an [*Error]: the provider request failed. Its Status and Message are
//     safe to show a client: they never hold the provider's URL or API key.
//     Status is the provider's own HTTP status when it answered non-2xx
//     (normalized path; the tunnel relays error answers as OpenAI error
//     objects instead), 502 for a redirect, 502 when it could not be reached or broke its stream
//     or answered 2xx with an error object, 504 on timeout,
//     400 when the request body cannot be translated (Param names the field).
//   - an error wrapping [ErrCancelled]: the caller's context ended; the
//     upstream HTTP request has been aborted.
//   - an error wrapping [ErrSink]: the sink refused an event or chunk (the
//     run stream is gone); the upstream request has been aborted.
//
// # Concurrency
//
// Adapters are safe for concurrent use; each call runs entirely on the
// caller's goroutine and shares only the provider's [net/http.Client], whose
// Transport pools connections (MaxIdleConnsPerHost ≥ the provider's
// capacity), and, in Ollama, the set of models that refused a think level
// (guarded by its mu; written after such a refusal, read before each
// request). An adapter starts no goroutines of its own, except CLI, whose
// Normalize starts up to four per call and ends them before it returns; the Transport's
// connection goroutines end when Close drops idle connections. Sinks are
// called from the calling goroutine only, one call at a time, in order.
package adapter
