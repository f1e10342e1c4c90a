// Package openai is OpenAI's API on the edge's HTTP API frame (package
// api): POST /v1/chat/completions, /v1/completions and /v1/embeddings.
// Routes registers them (api.Config.APIs). Their errors are the frame's
// default shape, OpenAI's ({"error":{...}}, api.Classify).
//
// A request's body is decoded and checked by package request
// (request.DecodeChat, DecodeCompletion, DecodeEmbeddings: the runs API
// and the Ollama routes check theirs with the same code) and dispatched
// with api.Frame.Serve.
// A tunnel-path run's answer is relayed byte for byte
// (api.Answer.RelayTunnel); a normalized-path run is rendered here. GET
// /v1/models and /v1/models/{model} stay in the frame: package anthropic
// answers an OpenAI client's listing with them too.
//
// # Where things live
//
//	routes.go       Routes; serve: read, decode, dispatch, render by execution path
//	chat.go         chatRender: one chat.completion, or chat.completion.chunk events (stream.ChatChunks)
//	completions.go  textRender: one text_completion, or text_completion chunks
//	embeddings.go   the embeddings list: vectors as numbers or base64
//
// # Invariants
//
//   - The answer names the model the client asked for, not the one served.
//   - A stream's status line goes with its first delta or its end: a run
//     that fails before either gets an error answer with its own status.
//   - A started stream that fails ends with one error event and no [DONE]
//     (api.Answer.FailStream).
//   - The events of one run message reach the client with one flush.
//   - An embeddings answer has one vector per input, or the run failed.
//
// # Concurrency
//
// None of its own: the request goroutine owns the answer and its run, as
// in package api.
package openai
