// Package translate is the one place where iop converts between the Ollama
// and OpenAI wire formats (Ollama API doc, github.com/ollama/ollama
// docs/api.md; OpenAI API reference, platform.openai.com/docs/api-reference).
//
// Requests: FromOllamaChat, FromOllamaGenerate and FromOllamaEmbed turn an
// Ollama client's /api/chat, /api/generate or /api/embed (/api/embeddings)
// body into a canonical OpenAI chat completions, completions or embeddings
// body, which the edge dispatches like any OpenAI request. Ollama fields
// OpenAI has no name for travel apart from the body, as Request.OllamaFields
// (the Dispatch's ollama_fields on the wire; an OpenAI client sends them
// as the body's ExtensionKey member, which the edge takes out with
// StripExtension). The other way, ToOllamaChat, ToOllamaGenerate and
// ToOllamaEmbed turn a canonical OpenAI body and its OllamaFields
// (ParseOllamaFields) into the Ollama body a node's Ollama adapter sends
// its provider, decoding the body once.
//
// OpenAI's Responses API (POST /v1/responses): DecodeResponsesRequest
// reads and checks a client's body, ResponsesRequest.ChatBody turns its
// conversation (ResponseItem values) into the canonical chat completions
// body every provider is sent, and a ResponseBuilder turns the answer's
// deltas into the response's output items and its stream events
// (responses_request.go, responses_items.go, responses_stream.go).
//
// The package is a format library used on each side: it knows nothing of
// the node protocol, and no wire field lives inside the JSON it reads or
// writes.
//
// Anthropic's Messages API (Anthropic API reference,
// docs.anthropic.com/en/api/messages): FromAnthropicMessages and
// FromAnthropicCountTokens turn a /v1/messages body into a canonical
// OpenAI chat body (anthropic_request.go), and AnthropicAnswer builds the
// answer, a message or its event stream, from an answer's parts
// (anthropic_response.go).
//
// Answers: OpenAIStream decodes an OpenAI SSE stream fed in chunks of any
// size (package sse does the framing) and DecodeOpenAIAnswer a whole answer;
// OllamaResponse and its helpers build the Ollama objects the edge writes.
//
// # Concurrency
//
// Functions are pure and safe for concurrent use. An OpenAIStream, an
// AnthropicAnswer and a ResponseBuilder hold one answer's state and are
// used by one goroutine at a time; the package
// starts no goroutines.
package translate
