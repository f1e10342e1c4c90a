package api

import "iop/internal/edge/contract"

// Body is an OpenAI route's request body as the frame decodes and checks
// it (DecodeChat, DecodeCompletion, DecodeEmbeddings).
type Body struct {
	// Request is the request to dispatch: Model, Operation, Stream, Needs
	// and EstimatedInputTokens read from the body, and Body the body with
	// its Ollama member (translate.ExtensionKey) moved to OllamaFields.
	// Headers is the caller's to set (ForwardHeaders).
	Request contract.Request
	// IncludeUsage is stream_options.include_usage (chat, completions): a
	// streamed answer ends with a usage chunk.
	IncludeUsage bool
	// Inputs is an embeddings body's number of inputs, thus of vectors in
	// the answer.
	Inputs int
	// Base64 is an embeddings body's encoding_format "base64": vectors as
	// the base64 of their little-endian float32 components.
	Base64 bool
}

// DecodeChat reads and checks a POST /v1/chat/completions body
// (decodeChatRequest), for Operation CHAT. Errors are InvalidParam's,
// naming the field.
func DecodeChat(body []byte) (Body, error) {
	chat, err := decodeChatRequest(body)
	if err != nil {
		return Body{}, err
	}
	b := Body{IncludeUsage: chat.IncludeUsage, Request: contract.Request{Model: chat.Model, Operation: contract.OperationChat,
		Stream: chat.Stream, Body: body, Needs: chat.Needs, EstimatedInputTokens: chat.EstimatedInputTokens}}
	return b, chat.ollama.moveTo(&b.Request)
}
