// Package adapter drives the model servers a node runs next to. An adapter
// takes one dispatched request (the client's OpenAI-shaped JSON body plus the
// served model name) and answers it over one of the two execution paths:
//
//   - normalized ([Normalizer]): the provider speaks its own protocol and the
//     adapter turns the answer into run events (started, delta, usage,
//     complete). [Ollama] translates chat completions to POST /api/chat,
//     completions to POST /api/generate and embeddings to POST /api/embed,
//     always streams from Ollama, and reads its NDJSON line by line. The
//     Dispatch's ollama_fields (Request.OllamaFields: Ollama-only fields
//     the client sent, keep_alive, think, num_ctx, ...) are set on the
//     Ollama request with their JSON values unchanged; the body is
//     decoded once. A
//     thinking model's message.thinking becomes the deltas' thinking.
//     STARTED goes with the answer's first line, so a 2xx whose first
//     line (or whole embed answer) is an error object fails with
//     [ErrProviderError] before anything was sent.
//   - tunnel ([Tunneler]): the provider is OpenAI-compatible (OpenAI, vLLM,
//     llama.cpp server, ...). [OpenAI] posts the body, with only its
//     top-level "model" rewritten to the served model (a body that needs
//     no change goes byte for byte as it came), to
//     {base_url}/chat/completions, /completions or /embeddings and relays a
//     2xx answer's status and body bytes unchanged, chunk by chunk as they
//     arrive (SSE passes through untouched), with an allowlist of its
//     headers, once the answer is known not to be an error object: an SSE
//     answer's head waits for its first event, any other answer's for its
//     end or its first 64 KiB. A 2xx that is an error object (the whole
//     JSON body, or the stream's first event) relays nothing and fails
//     with [ErrProviderError] (502, the provider's message). An SSE answer
//     is watched for a later error event inside the 2xx stream (relayed
//     unchanged, reported as [ErrProviderReported]) and for its closing
//     `data: [DONE]` (without it the stream was cut short:
//     [ErrProviderStream]).
//     An error answer (4xx, 5xx) is relayed as one OpenAI error
//     object with the provider's status, scrubbed of its URL and key (a
//     plain-text or HTML body keeps its text, or an HTML page's title); a
//     redirect is a 502.
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
