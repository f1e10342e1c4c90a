package request

import (
	"strconv"

	"iop/internal/jsonvalue"
)

// NeedEmbeddings is the capability an embeddings request needs of its
// provider (contract.Request.Needs).
const NeedEmbeddings = "embeddings"

// maxDimensions bounds "dimensions", the requested vector length.
const maxDimensions = 1 << 16

// embeddingsRequest is what the API reads from an embeddings request body
// (OpenAI API reference, "Create embeddings").
type embeddingsRequest struct {
	Model string
	// Inputs is the number of inputs, thus of vectors in the answer.
	Inputs int
	// Base64 is encoding_format "base64": vectors as the base64 of their
	// little-endian float32 components instead of arrays of numbers.
	Base64 bool
	// EstimatedInputTokens is the input's token ids plus its characters / 4.
	EstimatedInputTokens int
	// Needs are NeedEmbeddings, and NeedTokenInput for an input of token
	// ids (Ollama's /api/embed takes text only).
	Needs []string
	// ollama is the body's translate.ExtensionKey member.
	ollama ollamaMember
}

// decodeEmbeddingsRequest reads and checks an embeddings request body:
//
//	model            a non-empty string, required
//	input            required: a string, an array of 1-2048 strings, an array of
//	                 token ids or an array of 1-2048 token id arrays, none empty
//	dimensions       an integer in [1, 65536]
//	encoding_format  "float" (the default) or "base64"
//	user             a string
//
// It needs "embeddings" of its provider, and "token_input" (a tunnel-path
// provider) for token ids. Errors are *FieldError naming the field.
func decodeEmbeddingsRequest(body []byte) (embeddingsRequest, error) {
	top, err := parseBody(body)
	if err != nil {
		return embeddingsRequest{}, err
	}
	return embeddingsRequestOf(top)
}

// embeddingsRequestOf is decodeEmbeddingsRequest of a parsed body.
func embeddingsRequestOf(top *jsonvalue.Value) (embeddingsRequest, error) {
	var req embeddingsRequest
	var err error
	if req.Model, err = modelOf(top); err != nil {
		return embeddingsRequest{}, err
	}
	input, err := textInputOf(top.Get("input"), "input", true)
	if err != nil {
		return embeddingsRequest{}, err
	}
	req.Inputs, req.EstimatedInputTokens = input.Items, input.estimatedTokens()
	req.Needs = append([]string{NeedEmbeddings}, input.needs(false)...)
	if err := checkInteger(top.Get("dimensions"), "dimensions", 1, maxDimensions); err != nil {
		return embeddingsRequest{}, err
	}
	format, err := stringOf(top.Get("encoding_format"), "encoding_format")
	if err != nil {
		return embeddingsRequest{}, err
	}
	switch format {
	case "", "float":
	case "base64":
		req.Base64 = true
	default:
		return embeddingsRequest{}, &FieldError{Field: "encoding_format",
			Message: `must be "float" or "base64", got ` + strconv.Quote(Clip(format))}
	}
	if err := checkType(top.Get("user"), "user", WantString); err != nil {
		return embeddingsRequest{}, err
	}
	req.ollama = ollamaMemberOf(top)
	return req, nil
}
