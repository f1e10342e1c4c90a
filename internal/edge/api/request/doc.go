// Package request decodes and checks the bodies of the OpenAI routes
// (chat completions, completions, embeddings) and what other client APIs
// translate into them. A body is parsed once (package jsonvalue); the
// checks refuse, before any queue wait, what every provider would
// refuse, and find what the request needs of its provider and how large
// its input is. It imports no HTTP and not the frame (package api): the
// frame and the client API packages call it.
//
// # Where things live
//
//	body.go          Body, DecodeChat, DecodeCompletion, DecodeEmbeddings: a body as a contract.Request
//	chat.go          the chat body's checks: messages, tools, tool_choice, reasoning, stop, response_format
//	needs.go         the Need* capabilities a request can need of its provider
//	check.go         the JSON type and number checks (Want*, DecodeValue), shared by every body
//	completions.go   the completions body's checks
//	embeddings.go    the embeddings body's checks
//	input.go         a prompt or input (textInputOf), one parse of the body (parseBody, BodyParses)
//	ollamafields.go  an OpenAI client's iop_ollama member, moved out of the body to OllamaFields
//	translated.go    TranslatedChatNeeds, CheckTranslatedEmbed: the checks of what package ollama translated
//	clip.go          Clip: a client value quoted in a message, cut to 256 bytes
//	errors.go        FieldError, ErrInvalidBody, ErrInvalidField
//
// # Invariants
//
//   - Every error is a *FieldError naming the field ("messages[2].content[0].type";
//     "" for the body as a whole); the frame's Classify answers it 400.
//   - A body is parsed once; the dispatched body is the client's bytes,
//     less the iop_ollama member.
//   - Keys match exactly; a duplicated key counts by its last occurrence;
//     null counts as absent.
//   - An integer must be a JSON integer literal (1e0 and 1.0 are refused).
//   - Needs are listed each once, in a fixed order.
//   - A client value quoted in a message is clipped (Clip).
//
// # Concurrency
//
// Every function is safe for concurrent use; the only shared state is the
// BodyParses counter (atomic).
package request
