package openai

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
)

// embeddings serves POST /v1/embeddings: the body is checked
// (request.DecodeEmbeddings) and dispatched with Operation EMBEDDINGS to a
// provider with capability "embeddings" (none: 400 naming it), and, for
// token ids, to a tunnel-path one. A normalized run's vectors are
// rendered as {"object":"list","data":[{"object":"embedding","index",
// "embedding"}],"model","usage":{"prompt_tokens","total_tokens"}}.
func (s *server) embeddings(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, "embeddings", request.DecodeEmbeddings, func(a *api.Answer, _ contract.DispatchInfo, b *request.Body, model string) string {
		return writeEmbeddings(a, b, model)
	})
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

// writeEmbeddings collects the vectors of every delta, in order, and
// writes the list. A run that sends other than one vector per input
// failed (502). It returns the rendering's reason.
func writeEmbeddings(a *api.Answer, b *request.Body, model string) string {
	vectors, prompt, err := a.ReadVectors(b.Inputs)
	if err != nil {
		return a.Fail(err)
	}
	if api.ClientGone(a.HTTPRequest()) {
		return api.ReasonClientGone
	}
	data := make([]embeddingObject, 0, len(vectors))
	for i, vec := range vectors {
		obj := embeddingObject{Object: "embedding", Index: i, Embedding: vec}
		if b.Base64 {
			obj.Embedding = encodeFloat32s(vec)
		}
		data = append(data, obj)
	}
	api.WriteJSON(a.ResponseWriter(), http.StatusOK, struct {
		Object string            `json:"object"` // "list"
		Data   []embeddingObject `json:"data"`
		Model  string            `json:"model"`
		Usage  embeddingsUsage   `json:"usage"`
	}{"list", data, model, embeddingsUsage{PromptTokens: prompt, TotalTokens: prompt}})
	return api.ReasonCompleted
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
