package api

import (
	"fmt"
	"net/http"

	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// ollamaEmbed serves POST /api/embed (Ollama API doc, "Generate
// Embeddings": input a string or strings; truncate, dimensions,
// keep_alive, options) and, with legacy, the older POST /api/embeddings
// ({"model","prompt"} → {"embedding":[...]}). The body is translated to a
// canonical OpenAI embeddings body (translate.FromOllamaEmbed,
// FromOllamaEmbeddings), checked as POST /v1/embeddings checks it, and
// dispatched with Operation EMBEDDINGS to a provider with capability
// "embeddings" (none: 400 naming it) of either protocol. The answer is
// {"model","embeddings":[[...]],"total_duration","load_duration",
// "prompt_eval_count"} (durations in nanoseconds: the whole request, and
// the time before a provider took it), or {"embedding":[...]} for legacy;
// "model" is the name the client asked for. An empty input only loads the
// model: {"model","embeddings":[]} ({"embedding":[]}) at once, 404 for an
// unknown model. Errors are Ollama-shaped with the statuses of
// ollamaGenerate.
func (h *handler) ollamaEmbed(w http.ResponseWriter, r *http.Request, legacy bool) {
	obsOf(r).begin("ollama.embed")
	from := translate.FromOllamaEmbed
	if legacy {
		from = translate.FromOllamaEmbeddings
	}
	tr, req, start, ok := h.ollamaRequest(w, r, from)
	if !ok {
		return
	}
	req.Operation = contract.OperationEmbeddings
	req.Needs = []string{NeedEmbeddings}
	e := &ollamaEmbedRender{legacy: legacy, model: tr.Model, timings: translate.Timings{Start: start}}
	if tr.LoadOnly {
		e.timings.Dispatched, e.timings.End = start, h.cfg.Now()
		h.ollamaLoad(w, r, &req, e.answer(nil, 0))
		return
	}
	if err := checkOllamaEmbed(&tr); err != nil {
		h.writeOllamaError(w, r, err, &req)
		return
	}
	req.EstimatedInputTokens, e.inputs = (tr.InputChars+3)/4, len(tr.Inputs)
	h.serveOllamaRun(w, r, &req, tr.Extension, e)
}

// checkOllamaEmbed checks a translated embeddings request as
// decodeEmbeddingsRequest checks its canonical body (what that body could
// fail: the number of inputs, an empty one, the dimensions' range), from
// what the translation decoded (Inputs, Dimensions) instead of decoding
// the body it generated. Errors are decodeEmbeddingsRequest's.
func checkOllamaEmbed(tr *translate.Request) error {
	if len(tr.Inputs) > maxInputs {
		return &requestError{param: "input", message: fmt.Sprintf("at most %d items are allowed, got %d", maxInputs, len(tr.Inputs))}
	}
	for i, in := range tr.Inputs {
		if in == "" {
			return &requestError{param: fmt.Sprintf("input[%d]", i), message: "must not be an empty string"}
		}
	}
	if d := tr.Dimensions; d != nil && (*d < 1 || *d > maxDimensions) {
		return &requestError{param: "dimensions", message: fmt.Sprintf("must be an integer between %d and %d, got %d", 1, maxDimensions, *d)}
	}
	return nil
}

// ollamaEmbedRender renders an embeddings run as an Ollama answer. Only the
// request goroutine uses it.
type ollamaEmbedRender struct {
	*Answer
	legacy  bool
	model   string // the model name the client asked for
	inputs  int    // vectors the answer must have
	timings translate.Timings
}

var _ ollamaRun = (*ollamaEmbedRender)(nil)

// begin sets the run e renders, once it was dispatched.
func (e *ollamaEmbedRender) begin(rr *Answer) {
	e.Answer, e.timings.Dispatched = rr, rr.h.cfg.Now()
}

// normalized renders a normalized-path run: the vectors of its delta
// events and the prompt tokens of its usage event. It returns the rendering's reason.
func (e *ollamaEmbedRender) normalized() string {
	er := &eventReader{Answer: e.Answer}
	vectors, err := er.vectors(e.inputs)
	if err != nil {
		return e.fail(err)
	}
	return e.write(vectors, er.usage.PromptTokens)
}

// tunnel renders a tunnel-path run, the provider's OpenAI embeddings
// answer (vectors as numbers or base64; translate.DecodeOpenAIEmbeddings);
// an error status becomes an error answer with that status and the
// provider's message. It returns the rendering's reason.
func (e *ollamaEmbedRender) tunnel() string {
	_, body, err := e.tunnelAnswer(nil)
	if err != nil {
		return e.fail(err)
	}
	vectors, prompt, err := translate.DecodeOpenAIEmbeddings(body)
	if err == nil && len(vectors) != e.inputs {
		err = fmt.Errorf("%w: %d vectors for %d inputs", ErrUpstreamProtocol, len(vectors), e.inputs)
	}
	if err != nil {
		return e.fail(streamError(err))
	}
	return e.write(vectors, prompt)
}

// write writes the answer. It returns the rendering's reason.
func (e *ollamaEmbedRender) write(vectors [][]float32, promptTokens int) string {
	if clientGone(e.r) {
		return ReasonClientGone
	}
	e.timings.End = e.h.cfg.Now()
	writeOllamaJSON(e.w, http.StatusOK, e.answer(vectors, promptTokens))
	return ReasonCompleted
}

// answer is the answer object: /api/embed's, or for legacy /api/embeddings'
// with the one vector ([] when there is none).
func (e *ollamaEmbedRender) answer(vectors [][]float32, promptTokens int) any {
	if !e.legacy {
		return translate.NewOllamaEmbedResponse(e.model, vectors, promptTokens, e.timings)
	}
	vec := []float64{}
	if len(vectors) > 0 {
		for _, v := range vectors[0] {
			vec = append(vec, float64(v))
		}
	}
	return translate.OllamaEmbeddingResponse{Embedding: vec}
}
