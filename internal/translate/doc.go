// Package translate is the one place where iop converts between the Ollama
// and OpenAI wire formats (Ollama API doc, github.com/ollama/ollama
// docs/api.md; OpenAI API reference, platform.openai.com/docs/api-reference).
//
// Requests: FromOllamaChat, FromOllamaGenerate and FromOllamaEmbed turn an
// Ollama client's /api/chat, /api/generate or /api/embed (/api/embeddings)
// body into a canonical OpenAI chat completions, completions or embeddings
// body, which the edge dispatches like any OpenAI request. Ollama fields
// OpenAI has no name for travel under ExtensionKey; a node's Ollama adapter
// puts them back (ApplyExtension) and its OpenAI tunnel removes them
// (StripExtension). The other way, ToOllamaChat, ToOllamaGenerate and
// ToOllamaEmbed turn a canonical OpenAI body into the Ollama body a node's
// Ollama adapter sends its provider.
//
// Answers: OpenAIStream decodes an OpenAI SSE stream fed in chunks of any
// size (package sse does the framing) and DecodeOpenAIAnswer a whole answer;
// OllamaResponse and its helpers build the Ollama objects the edge writes.
//
// # Concurrency
//
// Functions are pure and safe for concurrent use. An OpenAIStream holds
// one stream's state and is used by one goroutine at a time; the package
// starts no goroutines.
package translate
