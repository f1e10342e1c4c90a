package translate

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"
)

// embedKnown and embeddingsKnown are the top-level fields of POST
// /api/embed and of the older POST /api/embeddings translated rather than
// carried in Request.OllamaFields.
var (
	embedKnown      = []string{"model", "input", "dimensions"}
	embeddingsKnown = []string{"model", "prompt"}
)

// canonicalEmbeddings is the canonical embeddings body, members in this
// order.
type canonicalEmbeddings struct {
	Model          string   `json:"model"`
	Input          []string `json:"input"`
	Dimensions     *int64   `json:"dimensions,omitempty"`
	EncodingFormat string   `json:"encoding_format"`
}

// FromOllamaEmbed translates a POST /api/embed body (Ollama API doc,
// "Generate Embeddings") into a canonical OpenAI embeddings body (OpenAI
// API reference, "Create embeddings"):
//
//	input (a string or strings)   input, always an array
//	dimensions                    dimensions
//	truncate, keep_alive,         carried in OllamaFields, values
//	options, unknown fields       unchanged (an OpenAI-compatible provider
//	                              truncates as it is configured to)
//
// and "encoding_format": "float". An empty input (absent, "", []) only
// loads the model, as in Ollama: LoadOnly is set (Unload with keep_alive
// 0). Errors are *FieldError: a body that is not a JSON object, a missing
// model, an input that is neither a string nor an array of strings, a
// dimensions that is not an integer, options that are not an object.
func FromOllamaEmbed(body []byte) (Request, error) {
	var in struct {
		Model string `json:"model"`
	}
	top, err := decodeRequest(body, &in)
	if err != nil {
		return Request{}, err
	}
	var inputs []string
	if raw := top["input"]; !isNull(raw) {
		var one string
		if json.Unmarshal(raw, &one) == nil {
			if one != "" {
				inputs = []string{one}
			}
		} else if err := decodeField(top, "input", &inputs); err != nil {
			return Request{}, fieldErr("input", "expected a string or an array of strings")
		}
	}
	out := canonicalEmbeddings{Input: inputs}
	if raw := top["dimensions"]; !isNull(raw) {
		n, err := integer(raw, "dimensions")
		if err != nil {
			return Request{}, err
		}
		out.Dimensions = &n
	}
	return embeddingsRequest(top, in.Model, embedKnown, out)
}

// FromOllamaEmbeddings translates a POST /api/embeddings body, Ollama's
// older embeddings API ({"model","prompt"}; Ollama API doc, "Generate
// Embedding"), as FromOllamaEmbed does with input [prompt]. An empty
// prompt only loads the model. Errors are *FieldError, as for
// FromOllamaEmbed, and a prompt that is not a string.
func FromOllamaEmbeddings(body []byte) (Request, error) {
	var in struct {
		Model  string `json:"model"`
		Prompt string `json:"prompt"`
	}
	top, err := decodeRequest(body, &in)
	if err != nil {
		return Request{}, err
	}
	var out canonicalEmbeddings
	if in.Prompt != "" {
		out.Input = []string{in.Prompt}
	}
	top[LegacyEmbeddingsKey] = json.RawMessage("true")
	return embeddingsRequest(top, in.Model, embeddingsKnown, out)
}

// LegacyEmbeddingsKey is the OllamaFields member FromOllamaEmbeddings
// sets (true): the request came to Ollama's older /api/embeddings, whose
// answer is the model's raw vector where /api/embed normalizes it, so an
// Ollama provider is asked on /api/embeddings too (ToOllamaEmbeddings).
// It is never sent to a provider.
const LegacyEmbeddingsKey = "iop_legacy_embeddings"

// TakeLegacyEmbeddings reports whether f has LegacyEmbeddingsKey true,
// and removes it from f.
func (f *OllamaFields) TakeLegacyEmbeddings() bool {
	if f == nil {
		return false
	}
	raw, ok := f.top[LegacyEmbeddingsKey]
	delete(f.top, LegacyEmbeddingsKey)
	return ok && string(raw) == "true"
}

// ollamaEmbeddingsRequest is the body of Ollama's POST /api/embeddings.
type ollamaEmbeddingsRequest struct {
	Model  string `json:"model"`
	Prompt string `json:"prompt"`
}

// ToOllamaEmbeddings translates an OpenAI embeddings body of one input
// into an Ollama /api/embeddings body for model ({"model","prompt"}, and
// fields as ToOllamaEmbed sets them). Errors are ToOllamaEmbed's, and more
// than one input.
func ToOllamaEmbeddings(body []byte, model string, fields *OllamaFields) ([]byte, error) {
	var in struct {
		Input json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fieldErr("", "request body is not a valid embeddings object")
	}
	inputs, err := stringOrStrings(in.Input, "input")
	if err != nil {
		return nil, err
	}
	if len(inputs) != 1 {
		return nil, fieldErr("input", "/api/embeddings takes exactly one prompt")
	}
	req := ollamaEmbeddingsRequest{Model: model, Prompt: inputs[0]}
	return fields.encode(&req, func(name string) bool { return name == "model" || name == "prompt" }, nil, nil)
}

// embeddingsRequest finishes an embeddings translation: every top-level
// field not in known goes into OllamaFields.
func embeddingsRequest(top map[string]json.RawMessage, model string, known []string, out canonicalEmbeddings) (Request, error) {
	t := &translation{top: top}
	req, err := t.required(model, known)
	if err != nil {
		return Request{}, err
	}
	req.Operation, req.Stream = Embeddings, false
	if opts, ok := top["options"]; ok && !isNull(opts) && firstByte(opts) != '{' {
		return Request{}, fieldErr("options", "expected an object")
	}
	if len(out.Input) == 0 {
		req.LoadOnly = true
		return req, nil
	}
	out.Model, out.EncodingFormat = model, "float"
	req.Inputs, req.Dimensions = out.Input, out.Dimensions
	for _, in := range out.Input {
		req.InputChars += utf8.RuneCountInString(in)
	}
	return t.finish(req, &out)
}

// OllamaEmbedResponse is the answer of POST /api/embed (Ollama API doc):
// one vector per input, in input order. Durations are in nanoseconds (see
// NewOllamaEmbedResponse).
type OllamaEmbedResponse struct {
	Model           string      `json:"model"`
	Embeddings      [][]float32 `json:"embeddings"`
	TotalDuration   int64       `json:"total_duration,omitempty"`
	LoadDuration    int64       `json:"load_duration,omitempty"`
	PromptEvalCount int         `json:"prompt_eval_count,omitempty"`
}

// NewOllamaEmbedResponse returns the /api/embed answer for model with
// vectors (never null: an empty list for a load), the prompt's tokens and
// the durations of t: total_duration End-Start, load_duration
// Dispatched-Start (the queue and dispatch), each at least 1 ns.
func NewOllamaEmbedResponse(model string, vectors [][]float32, promptTokens int, t Timings) OllamaEmbedResponse {
	if vectors == nil {
		vectors = [][]float32{}
	}
	return OllamaEmbedResponse{
		Model:           model,
		Embeddings:      vectors,
		TotalDuration:   max(int64(t.End.Sub(t.Start)), 1),
		LoadDuration:    max(int64(t.Dispatched.Sub(t.Start)), 1),
		PromptEvalCount: promptTokens,
	}
}

// OllamaEmbeddingResponse is the answer of the older POST /api/embeddings:
// the prompt's vector ([] for a load).
type OllamaEmbeddingResponse struct {
	// Embedding is written as float64, as Ollama writes it (its
	// api.EmbeddingResponse): each float32 value widened, so a client
	// reads the same numbers as from Ollama.
	Embedding []float64 `json:"embedding"`
}

// DecodeOpenAIEmbeddings decodes an OpenAI embeddings answer (OpenAI API
// reference, the embedding object) with each "embedding" an array of
// numbers or, for encoding_format base64, the standard base64 of its
// little-endian float32 components. It returns the vectors ordered by
// "index" and usage.prompt_tokens. Errors: a *ProviderError for a body
// holding an "error" member; ErrMalformedAnswer for a body that is not such
// an answer, a vector that decodes as neither form, or indexes that are not
// 0..n-1, each once.
func DecodeOpenAIEmbeddings(body []byte) ([][]float32, int, error) {
	var obj struct {
		Data []struct {
			Index     int             `json:"index"`
			Embedding json.RawMessage `json:"embedding"`
		} `json:"data"`
		Usage *struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, 0, fmt.Errorf("%w: the body is not an embeddings list", ErrMalformedAnswer)
	}
	if err := providerError(obj.Error); err != nil {
		return nil, 0, err
	}
	vectors := make([][]float32, len(obj.Data))
	for _, d := range obj.Data {
		if d.Index < 0 || d.Index >= len(vectors) || vectors[d.Index] != nil {
			return nil, 0, fmt.Errorf("%w: embedding index %d out of place", ErrMalformedAnswer, d.Index)
		}
		v, err := decodeVector(d.Embedding)
		if err != nil {
			return nil, 0, fmt.Errorf("%w: embedding %d: %w", ErrMalformedAnswer, d.Index, err)
		}
		vectors[d.Index] = v
	}
	prompt := 0
	if obj.Usage != nil {
		prompt = obj.Usage.PromptTokens
	}
	return vectors, prompt, nil
}

// decodeVector reads one "embedding": an array of numbers or a base64
// string of little-endian float32s. Never nil on success.
func decodeVector(raw json.RawMessage) ([]float32, error) {
	switch firstByte(raw) {
	case '[':
		v := []float32{}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("not an array of numbers")
		}
		return v, nil
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b)%4 != 0 {
			return nil, fmt.Errorf("not base64 float32 data")
		}
		v := make([]float32, 0, len(b)/4)
		for ; len(b) > 0; b = b[4:] {
			v = append(v, math.Float32frombits(binary.LittleEndian.Uint32(b)))
		}
		return v, nil
	}
	return nil, fmt.Errorf("expected an array of numbers or a base64 string")
}
