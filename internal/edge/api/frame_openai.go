package api

import (
	"iop/internal/edge/contract"
	"iop/internal/sse"
)

// What package openai serves its routes with, beyond frame.go: the
// OpenAI bodies decoded and checked (the runs API and the Ollama routes
// check theirs with the same code, decode.go), and the Answer's tunnel
// relay, SSE writer, flush hold and OpenAI error event.

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

// DecodeCompletion reads and checks a POST /v1/completions body
// (decodeCompletionRequest), for Operation COMPLETION. Errors are
// InvalidParam's, naming the field.
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
// InvalidParam's, naming the field.
func DecodeEmbeddings(body []byte) (Body, error) {
	er, err := decodeEmbeddingsRequest(body)
	if err != nil {
		return Body{}, err
	}
	b := Body{Inputs: er.Inputs, Base64: er.Base64, Request: contract.Request{Model: er.Model, Operation: contract.OperationEmbeddings,
		Body: body, Needs: er.Needs, EstimatedInputTokens: er.EstimatedInputTokens}}
	return b, er.ollama.moveTo(&b.Request)
}

// RelayTunnel relays a tunnel-path run's answer unchanged: the provider's
// status and headers (but its connection's), then its body, each part
// flushed as it comes; the bytes that end it wait for the run's end. It
// returns the rendering's reason.
func (rr *Answer) RelayTunnel() string { return rr.tunnel() }

// EventWriter is the SSE writer of the answer's body; its writes go
// through Write (and a Hold).
func (rr *Answer) EventWriter() *sse.Writer { return rr.events() }

// Hold makes Write leave its flushes to Release: what is written until
// then reaches the client with one flush.
func (rr *Answer) Hold() { rr.hold = true }

// Release ends a Hold and flushes what was written under it.
func (rr *Answer) Release() error { return rr.release() }

// FailStream ends a started event stream that failed with err: one
// OpenAI error event, data {"error":{...}} as Classify maps err, and no
// [DONE]; the connection is aborted when the client is gone or the event
// cannot be written. It returns the rendering's reason.
func (rr *Answer) FailStream(err error) string { return rr.failStarted(err, true) }

// ReadVectors reads a normalized-path embeddings run to its end: the
// vectors of its delta events, in order, and its prompt tokens. A run
// that sends other than inputs vectors failed (ErrUpstreamProtocol);
// else ReadEvents' errors.
func (rr *Answer) ReadVectors(inputs int) (vectors [][]float32, promptTokens int, err error) {
	er := &eventReader{Answer: rr}
	vectors, err = er.vectors(inputs)
	return vectors, er.usage.PromptTokens, err
}
