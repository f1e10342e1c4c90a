package anthropic

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"

	"iop/internal/edge/api"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// Paths of Anthropic's Messages API (Anthropic API reference, "Messages",
// "Count Message tokens", "Models").
const (
	messagesPath    = "/v1/messages"
	countTokensPath = "/v1/messages/count_tokens"
	modelsPath      = "/v1/models"
)

// versionHeader is the header every request of Anthropic's SDKs carries
// (Anthropic API reference, "Versions"): GET /v1/models answers such a
// request in Anthropic's shape.
const versionHeader = "Anthropic-Version"

// server serves the Messages API on the frame. Its fields are set by
// Routes and only read after.
type server struct {
	f      *api.Frame
	logger *slog.Logger
}

// Routes are the routes of Anthropic's Messages API on f (an api.API for
// api.Config.APIs): POST /v1/messages and /v1/messages/count_tokens, and
// GET /v1/models and /v1/models/{model} in Anthropic's shape for a
// request that names an anthropic-version (else the frame's OpenAI
// answer). Errors on /v1/messages and under it are Anthropic's.
func Routes(f *api.Frame) map[string]api.Route {
	s := &server{f: f, logger: f.Logger()}
	f.Errors(messagesPath, s.writeError)
	return map[string]api.Route{
		messagesPath:     {Method: http.MethodPost, Serve: s.messages, Operation: "anthropic.messages"},
		countTokensPath:  {Method: http.MethodPost, Serve: s.countTokens},
		modelsPath:       {Method: http.MethodGet, Serve: s.listModels},
		modelsPath + "/": {Method: http.MethodGet, Serve: s.getModel},
	}
}

// anthropicMessages serves POST /v1/messages: the body is translated
// (translate.FromAnthropicMessages) into a canonical OpenAI chat request,
// dispatched as a chat (its needs from the translation: tools, vision,
// remote images, thinking), and the
// run rendered as a Messages API answer (messagesRender): one message
// object, or with "stream": true Anthropic's event stream, which starts
// after messagesPingInterval of quiet while the request waits for its
// dispatch too (dispatchQuiet: queued, or for the provider's first
// message; a failure after that is its error event). Headers
// anthropic-version and anthropic-beta are accepted and not required.
// Statuses, with Anthropic's error body (writeAnthropicError): 400 a body
// that cannot be translated, 413 body over Config.MaxBodyBytes, 415 a
// non-JSON Content-Type, then whatever classify maps a dispatch or
// upstream failure to.
func (s *server) messages(w http.ResponseWriter, r *http.Request) {
	api.Begin(r, "anthropic.messages")
	body, err := s.f.ReadBody(r)
	if err == nil {
		var tr translate.AnthropicRequest
		if tr, err = translate.FromAnthropicMessages(body); err == nil {
			req := anthropicDispatch(r, tr)
			api.ClientStreams(r, tr.Stream)
			if len(tr.Extension) > 0 {
				s.logger.Debug("Messages fields only Ollama providers take", "fields", tr.Extension)
			}
			var m *messagesRender // made once, by the first of the calls below
			render := func(rr *api.Answer) *messagesRender {
				if m == nil {
					m = newMessagesRender(rr, tr)
				}
				return m
			}
			rend := api.Renderer{
				WriteError: s.writeError,
				Tunnel: func(rr *api.Answer, info contract.DispatchInfo) string {
					return render(rr).dispatched(info).tunnel()
				},
				Normalized: func(rr *api.Answer, info contract.DispatchInfo) string {
					return render(rr).dispatched(info).normalized()
				},
			}
			if tr.Stream {
				// A ping every messagesPingInterval from the start, while
				// the request waits for its provider too.
				rend.Quiet = func(rr *api.Answer) error { return render(rr).quiet() }
				rend.QuietInterval = messagesPingInterval
				rend.Failed = func(rr *api.Answer, err error) string { return render(rr).failed(err) }
			}
			s.f.Serve(w, r, &req, rend)
			return
		}
	}
	s.writeError(w, r, anthropicRequestError(err), nil)
}

// anthropicRequestError turns a translation's *translate.FieldError into
// the frame's invalid parameter (400, api.InvalidParam).
func anthropicRequestError(err error) error {
	var fe *translate.FieldError
	if errors.As(err, &fe) {
		return api.InvalidParam(fe.Field, fe.Message)
	}
	return err
}

// anthropicDispatch is the Request of a translated Messages request.
func anthropicDispatch(r *http.Request, tr translate.AnthropicRequest) contract.Request {
	req := contract.Request{Model: tr.Model, Operation: contract.OperationChat, Stream: true, Body: tr.Body,
		OllamaFields: tr.OllamaFields, EstimatedInputTokens: tr.EstimatedInputTokens, Headers: map[string]string{}}
	if id := r.Header.Get("X-Request-Id"); id != "" {
		req.Headers["X-Request-Id"] = id
	}
	if tr.Stream {
		// The stream may start, naming its message after the run, before
		// Dispatch returns (dispatchQuiet).
		req.RunID = api.NewRunID()
	}
	for _, n := range []struct {
		on   bool
		need string
	}{{tr.Tools, request.NeedTools}, {tr.Vision, request.NeedVision},
		{tr.RemoteImages, request.NeedRemoteImages}, {tr.Thinking, request.NeedThinking}} {
		if n.on {
			req.Needs = append(req.Needs, n.need)
		}
	}
	return req
}

// countTokens serves POST /v1/messages/count_tokens: {"input_tokens": N},
// N the estimate the edge admits a Messages request with (its
// EstimatedInputTokens: characters / 4, the long-context threshold's
// measure), for a body checked as a create is (without max_tokens), and
// a model the key may use (403) and that POST /v1/messages would take
// (resolveModel; else 404). Nothing is dispatched.
func (s *server) countTokens(w http.ResponseWriter, r *http.Request) {
	body, err := s.f.ReadBody(r)
	if err != nil {
		s.writeError(w, r, err, nil)
		return
	}
	tr, err := translate.FromAnthropicCountTokens(body)
	if err != nil {
		s.writeError(w, r, anthropicRequestError(err), nil)
		return
	}
	req := &contract.Request{Model: tr.Model}
	if _, err := s.f.ResolveModel(r, tr.Model); err != nil {
		s.writeError(w, r, err, req)
		return
	}
	api.WriteJSON(w, http.StatusOK, map[string]int{"input_tokens": tr.EstimatedInputTokens})
}

// statusOverloaded is Anthropic's 529 "overloaded_error", which its
// clients retry.
const statusOverloaded = 529

// anthropicError maps err as classify does, then to Anthropic's statuses
// and error types (Anthropic API reference, "Errors"): 400
// invalid_request_error, 401 authentication_error, 403 permission_error,
// 404 not_found_error, 413 request_too_large, 429 rate_limit_error (a
// key's limits, a provider's 429), 500 api_error; a full queue and a queue
// timeout are 529 overloaded_error with Retry-After, the status
// Anthropic's clients retry on when the service is busy. No provider
// serving the model now keeps iop's 503 (with Retry-After), as an outage
// of the model rather than load, with type overloaded_error, as Ollama's
// Messages API types a 503. Other statuses keep classify's, with type
// invalid_request_error below 500 and api_error from 500.
func anthropicError(err error, req *contract.Request) (e *api.APIError, status int, typ string) {
	e = api.Classify(err, req)
	status = e.Status()
	if errors.Is(err, api.ErrCandidatesRejected) {
		// The edge words the tool_choice need in the chat API's terms;
		// a Messages client sent tool_choice "any".
		words := *e
		words.Message = strings.ReplaceAll(e.Message, `tool_choice "required" or parallel_tool_calls false`, `tool_choice "any"`)
		e = &words
	}
	switch {
	case errors.Is(err, api.ErrQueueFull), errors.Is(err, api.ErrQueueTimeout), errors.Is(err, api.ErrShed):
		return e, statusOverloaded, "overloaded_error"
	case errors.Is(err, api.ErrNoProvider), errors.Is(err, api.ErrProviderUnavailable):
		return e, status, "overloaded_error"
	}
	switch status {
	case http.StatusUnauthorized:
		typ = "authentication_error"
	case http.StatusForbidden:
		typ = "permission_error"
	case http.StatusNotFound:
		typ = "not_found_error"
	case http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case http.StatusTooManyRequests:
		typ = "rate_limit_error"
	default:
		typ = "invalid_request_error"
		if status >= 500 {
			typ = "api_error"
		}
	}
	return e, status, typ
}

// writeError answers err in Anthropic's shape (anthropicError):
// {"type":"error","error":{"type","message"}}.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
	s.f.WriteErrorAs(w, r, err, req, func(err error, req *contract.Request) (*api.APIError, int, any) {
		e, status, typ := anthropicError(err, req)
		return e, status, translate.NewAnthropicError(typ, e.Message)
	})
}
