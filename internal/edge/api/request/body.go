package request

import "iop/internal/edge/contract"

// Body is an OpenAI route's request body as decoded and checked
// (DecodeChat, DecodeCompletion, DecodeEmbeddings).
type Body struct {
	// Request is the request to dispatch: Model, Operation, Stream, Needs
	// and EstimatedInputTokens read from the body, and Body the body with
	// its Ollama member (translate.ExtensionKey) moved to OllamaFields.
	// Headers is the caller's to set.
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
// (decodeChatRequest), for Operation CHAT. Errors are *FieldError,
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

// DecodeCompletion reads and checks a POST /v1/completions body
// (decodeCompletionRequest), for Operation COMPLETION. Errors are
// *FieldError, naming the field.
func DecodeCompletion(body []byte) (Body, error) {
	cr, err := decodeCompletionRequest(body)
	if err != nil {
		return Body{}, err
	}
	b := Body{IncludeUsage: cr.IncludeUsage, Request: contract.Request{Model: cr.Model, Operation: contract.OperationCompletion,
		Stream: cr.Stream, Body: body, Needs: cr.Needs, EstimatedInputTokens: cr.EstimatedInputTokens}}
	return b, cr.ollama.moveTo(&b.Request)
}

// DecodeEmbeddings reads and checks a POST /v1/embeddings body
// (decodeEmbeddingsRequest), for Operation EMBEDDINGS. Errors are
// *FieldError, naming the field.
func DecodeEmbeddings(body []byte) (Body, error) {
	er, err := decodeEmbeddingsRequest(body)
	if err != nil {
		return Body{}, err
	}
	b := Body{Inputs: er.Inputs, Base64: er.Base64, Request: contract.Request{Model: er.Model, Operation: contract.OperationEmbeddings,
		Body: body, Needs: er.Needs, EstimatedInputTokens: er.EstimatedInputTokens}}
	return b, er.ollama.moveTo(&b.Request)
}
