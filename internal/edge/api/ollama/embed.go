package ollama

import (
	"fmt"
	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"net/http"

	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// embed serves POST /api/embed (Ollama API doc, "Generate
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
func (s *server) embed(w http.ResponseWriter, r *http.Request, legacy bool) {
	api.Begin(r, "ollama.embed")
	from := translate.FromOllamaEmbed
	if legacy {
		from = translate.FromOllamaEmbeddings
	}
	tr, req, start, ok := s.request(w, r, from)
	if !ok {
		return
	}
	req.Operation = contract.OperationEmbeddings
	req.Needs = []string{request.NeedEmbeddings}
	e := &embedRender{s: s, legacy: legacy, model: tr.Model, timings: translate.Timings{Start: start}}
	if tr.LoadOnly {
		e.timings.Dispatched, e.timings.End = start, s.f.Now()
		s.load(w, r, &req, e.answer(nil, 0))
		return
	}
	if err := request.CheckTranslatedEmbed(&tr); err != nil {
		s.writeError(w, r, err, &req)
		return
	}
	req.EstimatedInputTokens, e.inputs = (tr.InputChars+3)/4, len(tr.Inputs)
	s.serveRun(w, r, &req, tr.Extension, e)
}

// embedRender renders an embeddings run as an Ollama answer. Only the
// request goroutine uses it.
type embedRender struct {
	*api.Answer
	s       *server
	legacy  bool
	model   string // the model name the client asked for
	inputs  int    // vectors the answer must have
	timings translate.Timings
}

var _ run = (*embedRender)(nil)

// begin sets the run e renders, once it was dispatched.
func (e *embedRender) begin(a *api.Answer) {
	e.Answer, e.timings.Dispatched = a, e.s.f.Now()
}

// normalized renders a normalized-path run: the vectors of its delta
// events and the prompt tokens of its usage event. It returns the rendering's reason.
func (e *embedRender) normalized() string {
	vectors, prompt, err := e.ReadVectors(e.inputs)
	if err != nil {
		return e.Fail(err)
	}
	return e.write(vectors, prompt)
}

// tunnel renders a tunnel-path run, the provider's OpenAI embeddings
// answer (vectors as numbers or base64; translate.DecodeOpenAIEmbeddings);
// an error status becomes an error answer with that status and the
// provider's message. It returns the rendering's reason.
func (e *embedRender) tunnel() string {
	_, body, err := e.TunnelAnswer(nil)
	if err != nil {
		return e.Fail(err)
	}
	vectors, prompt, err := translate.DecodeOpenAIEmbeddings(body)
	if err == nil && len(vectors) != e.inputs {
		err = fmt.Errorf("%w: %d vectors for %d inputs", api.ErrUpstreamProtocol, len(vectors), e.inputs)
	}
	if err != nil {
		return e.Fail(api.StreamError(err))
	}
	return e.write(vectors, prompt)
}

// write writes the answer. It returns the rendering's reason.
func (e *embedRender) write(vectors [][]float32, promptTokens int) string {
	if api.ClientGone(e.HTTPRequest()) {
		return api.ReasonClientGone
	}
	e.timings.End = e.s.f.Now()
	writeJSON(e.ResponseWriter(), http.StatusOK, e.answer(vectors, promptTokens))
	return api.ReasonCompleted
}

// answer is the answer object: /api/embed's, or for legacy /api/embeddings'
// with the one vector ([] when there is none).
func (e *embedRender) answer(vectors [][]float32, promptTokens int) any {
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
