// Package media is the edge's routes for the endpoints local model
// servers offer beside chat: rerank, audio transcription and speech,
// image generation, and llama.cpp's own /infill and /completion. Each is
// relayed on the tunnel path, byte for byte, through the frame's
// admission and records (api.Relay); it registers on the frame through
// api.Config.Routes, and the upload route's body limits through
// api.Config.BodyLimits.
//
// # Where things live
//
//	routes.go   Routes, Config, the capabilities, the JSON routes' handler
//	check.go    the JSON bodies' checks (model, required fields) and token estimates
//	upload.go   the multipart transcription: read to its model field, spool, relay as it comes
//
// # Routes
//
//	POST /v1/rerank, /rerank        capability rerank            vLLM, llama.cpp, Jina, Cohere shape
//	POST /v1/audio/transcriptions   capability transcription     multipart/form-data, streamed
//	POST /v1/audio/speech           capability speech            JSON in, audio bytes out
//	POST /v1/images/generations     capability images
//	POST /infill                    capability infill            llama.cpp's native JSON
//	POST /completion                capability llama_completion  llama.cpp's native JSON, SSE with "stream":true
//
// # Invariants
//
//   - A request goes only to a provider that advertises the route's
//     capability; a model without one is answered 400 naming it.
//   - The provider receives the client's body, its model set to the
//     served model's name, and the client receives the provider's answer,
//     both unchanged otherwise.
//   - An upload is never held whole: at most maxHeldPrefix bytes before
//     its model field in memory (the rest of that prefix in a temporary
//     file), the remainder read as the run's stream takes it.
//   - A streamed body is read once: such a request is never retried on
//     another provider.
//   - A multipart body names its model once: a second part named model
//     fails the request with 400 before any byte of that part is relayed
//     (oneModel).
//
// # Concurrency
//
// The routes are read-only after Routes. An upload's spool is written by
// its request goroutine before the relay; the edge's run stream goroutine
// then reads the spool and the rest of the body (gate) while the request
// goroutine waits in api.Relay; gate refuses reads once the handler
// returned.
package media
