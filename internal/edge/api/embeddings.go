package api

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
	"strconv"

	"iop/internal/edge/contract"
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
// provider) for token ids. Errors are *requestError naming the field.
func decodeEmbeddingsRequest(body []byte) (embeddingsRequest, error) {
	top, err := parseBody(body)
	if err != nil {
		return embeddingsRequest{}, err
	}
	return embeddingsRequestOf(top)
}

// embeddingsRequestOf is decodeEmbeddingsRequest of a parsed body.
func embeddingsRequestOf(top *jsonValue) (embeddingsRequest, error) {
	var req embeddingsRequest
	var err error
	if req.Model, err = modelOf(top); err != nil {
		return embeddingsRequest{}, err
	}
	input, err := textInputOf(top.get("input"), "input", true)
	if err != nil {
		return embeddingsRequest{}, err
	}
	req.Inputs, req.EstimatedInputTokens = input.Items, input.estimatedTokens()
	req.Needs = append([]string{NeedEmbeddings}, input.needs(false)...)
	if err := checkInteger(top.get("dimensions"), "dimensions", 1, maxDimensions); err != nil {
		return embeddingsRequest{}, err
	}
	format, err := stringOf(top.get("encoding_format"), "encoding_format")
	if err != nil {
		return embeddingsRequest{}, err
	}
	switch format {
	case "", "float":
	case "base64":
		req.Base64 = true
	default:
		return embeddingsRequest{}, &requestError{param: "encoding_format",
			message: `must be "float" or "base64", got ` + strconv.Quote(Clip(format))}
	}
	if err := checkType(top.get("user"), "user", wantString); err != nil {
		return embeddingsRequest{}, err
	}
	req.ollama = ollamaMemberOf(top)
	return req, nil
}

// embeddings serves POST /v1/embeddings: it decodes and checks the body and
// dispatches it with Operation EMBEDDINGS to a provider with capability
// "embeddings" (none: 400 naming it), and, for token ids, to a tunnel-path
// one (NeedTokenInput). The tunnel path relays the
// provider's answer; the normalized path's vectors are rendered as
// {"object":"list","data":[{"object":"embedding","index","embedding"}],
// "model","usage":{"prompt_tokens","total_tokens"}}. Statuses as for chat
// completions.
func (h *handler) embeddings(w http.ResponseWriter, r *http.Request) {
	obsOf(r).begin("embeddings")
	body, err := h.readBody(r)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	er, err := decodeEmbeddingsRequest(body)
	if err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	req := contract.Request{
		Model:                er.Model,
		Operation:            contract.OperationEmbeddings,
		Body:                 body,
		Needs:                er.Needs,
		EstimatedInputTokens: er.EstimatedInputTokens,
		Headers:              forwardHeaders(r.Header),
	}
	if err := er.ollama.moveTo(&req); err != nil {
		h.writeError(w, r, err, nil)
		return
	}
	h.serveRun(w, r, &req, func(rr *Answer, info contract.DispatchInfo) string {
		return (&embeddingsRender{eventReader: eventReader{Answer: rr}, req: er}).json()
	})
}

// embeddingsRender renders a normalized-path embeddings run.
type embeddingsRender struct {
	eventReader
	req embeddingsRequest
}

// embeddingObject is one entry of the answer's "data". Embedding is a
// []float32 or, for encoding_format base64, a string.
type embeddingObject struct {
	Object    string `json:"object"` // "embedding"
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"`
}

// embeddingsUsage is the usage of an embeddings answer, in tokens.
type embeddingsUsage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// json collects the vectors of every delta, in order, and writes the list.
// A run that sends other than one vector per input failed (502). It returns
// the rendering's reason.
func (e *embeddingsRender) json() string {
	vectors, err := e.vectors(e.req.Inputs)
	if err != nil {
		return e.fail(err)
	}
	if clientGone(e.r) {
		return ReasonClientGone
	}
	data := make([]embeddingObject, 0, len(vectors))
	for i, vec := range vectors {
		obj := embeddingObject{Object: "embedding", Index: i, Embedding: vec}
		if e.req.Base64 {
			obj.Embedding = encodeFloat32s(vec)
		}
		data = append(data, obj)
	}
	writeJSON(e.w, http.StatusOK, struct {
		Object string            `json:"object"` // "list"
		Data   []embeddingObject `json:"data"`
		Model  string            `json:"model"`
		Usage  embeddingsUsage   `json:"usage"`
	}{"list", data, e.req.Model, embeddingsUsage{PromptTokens: e.usage.PromptTokens, TotalTokens: e.usage.PromptTokens}})
	return ReasonCompleted
}

// vectors reads a normalized-path embeddings run to its end and returns
// the vectors of its delta events, in order. A run that sends other than
// inputs vectors failed: ErrUpstreamProtocol; else next's errors.
func (e *eventReader) vectors(inputs int) ([][]float32, error) {
	vectors := make([][]float32, 0, inputs)
	_, err := e.next(func(ev *contract.Event) error {
		for _, vec := range ev.Embeddings {
			if len(vectors) == inputs {
				return fmt.Errorf("%w: more vectors than inputs", ErrUpstreamProtocol)
			}
			vectors = append(vectors, vec)
		}
		return nil
	})
	if err == nil && len(vectors) != inputs {
		err = fmt.Errorf("%w: %d vectors for %d inputs", ErrUpstreamProtocol, len(vectors), inputs)
	}
	return vectors, err
}

// encodeFloat32s is OpenAI's base64 encoding of a vector: the standard
// base64 of its components as little-endian IEEE 754 float32.
func encodeFloat32s(v []float32) string {
	buf := make([]byte, 0, 4*len(v))
	for _, f := range v {
		buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
	}
	return base64.StdEncoding.EncodeToString(buf)
}
