// Package ollama is Ollama's API on the edge's HTTP API frame (package
// api), as Ollama 0.17.4 answers it: POST /api/chat, /api/generate,
// /api/embed, /api/embeddings, /api/show, /api/pull; GET /api/tags,
// /api/ps, /api/version, and GET / ("Ollama is running"). Routes
// registers them (api.Config.APIs); errors at / and under /api/ are
// Ollama's ({"error":"..."}, writeError).
//
// # Where things live
//
//	ollama.go   Routes, Config; chat and generate (translated by package translate), load, tags, ps, show, pull, manage, the error mapping
//	render.go   render: a chat or generate run as NDJSON lines or one object
//	embed.go    embed, embedRender: /api/embed and the older /api/embeddings
//	catalog.go  ModelCatalog, ModelShower (Config); ollamaName, the listing's names
//
// # Invariants
//
//   - An unknown model is `model 'x' not found` (Ollama's text, which
//     clients match on), whatever its status.
//   - A request with nothing to generate or embed only loads: answered at
//     once for a model the edge knows, nothing dispatched.
//   - A streamed answer sends its status line with its first output; one
//     that fails after it ends with one {"error":"..."} line and no done
//     object.
//   - /api/copy, /api/delete, /api/create, /api/push and /api/blobs/...
//     are 403: the model servers behind the nodes manage their models.
//   - The checks and needs of a translated body are package request's
//     (request.TranslatedChatNeeds, request.CheckTranslatedEmbed), as the
//     OpenAI routes find them in the canonical body.
//
// # Concurrency
//
// The request goroutine owns the answer and its run, as in package api;
// the package starts no goroutine. Routes' server is read-only after
// Routes.
package ollama
