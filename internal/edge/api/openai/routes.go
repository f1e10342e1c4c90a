package openai

import (
	"net/http"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
)

// The routes' paths.
const (
	chatPath        = "/v1/chat/completions"
	completionsPath = "/v1/completions"
	embeddingsPath  = "/v1/embeddings"
)

// Routes is the OpenAI API's routes on f (an api.API): POST
// /v1/chat/completions, /v1/completions and /v1/embeddings. Their errors
// are the frame's default shape, OpenAI's ({"error":{...}}).
func Routes(f *api.Frame) map[string]api.Route {
	s := &server{f: f}
	return map[string]api.Route{
		chatPath:        {Method: http.MethodPost, Serve: s.chatCompletions, Operation: "chat.completions"},
		completionsPath: {Method: http.MethodPost, Serve: s.completions, Operation: "completions"},
		embeddingsPath:  {Method: http.MethodPost, Serve: s.embeddings, Operation: "embeddings"},
	}
}

// server serves the routes; it is read-only after Routes.
type server struct{ f *api.Frame }

// serve reads a route's body, decodes it with decode, and dispatches it
// with the client's forwarded headers: the tunnel path's answer is relayed
// unchanged, the normalized path's rendered by normalized (with the body
// as decoded and the model name the client asked for). operation names
// the request's record. Statuses: 415 a non-JSON Content-Type, 413 a body
// over its limit, 408 a body not in in time, 400 a body decode refuses,
// then whatever api.Classify maps a dispatch or upstream failure to.
func (s *server) serve(w http.ResponseWriter, r *http.Request, operation string, decode func([]byte) (request.Body, error),
	normalized func(a *api.Answer, info contract.DispatchInfo, b *request.Body, model string) string) {
	api.Begin(r, operation)
	body, err := s.f.ReadBody(r)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	b, err := decode(body)
	if err != nil {
		s.f.WriteError(w, r, err, nil)
		return
	}
	b.Request.Headers = api.ForwardHeaders(r.Header)
	model := b.Request.Model
	s.f.Serve(w, r, &b.Request, api.Renderer{
		WriteError: s.f.WriteError,
		Tunnel:     func(a *api.Answer, _ contract.DispatchInfo) string { return a.RelayTunnel() },
		Normalized: func(a *api.Answer, info contract.DispatchInfo) string { return normalized(a, info, &b, model) },
	})
}

// usage is the OpenAI usage object, in tokens.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// usageOf is the usage of a run whose events ended as ev.
func usageOf(ev api.Events) usage {
	return usage{PromptTokens: ev.PromptTokens, CompletionTokens: ev.CompletionTokens,
		TotalTokens: ev.PromptTokens + ev.CompletionTokens}
}
