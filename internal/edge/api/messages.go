package api

import (
	"errors"
	"net/http"
	"strings"

	"iop/internal/edge/contract"
	"iop/internal/translate"
)

// Paths of Anthropic's Messages API (Anthropic API reference, "Messages",
// "Count Message tokens").
const (
	messagesPath    = "/v1/messages"
	countTokensPath = "/v1/messages/count_tokens"
)

// isAnthropicPath reports whether path belongs to the Messages API, whose
// errors are Anthropic-shaped.
func isAnthropicPath(path string) bool {
	return path == messagesPath || strings.HasPrefix(path, messagesPath+"/")
}

// errorWriterFor is the error writer of path's API: Anthropic's, Ollama's
// or OpenAI's shape.
func (h *handler) errorWriterFor(path string) func(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
	switch {
	case isAnthropicPath(path):
		return h.writeAnthropicError
	case isOllamaPath(path):
		return h.writeOllamaError
	}
	return h.writeError
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
func (h *handler) anthropicMessages(w http.ResponseWriter, r *http.Request) {
	obsOf(r).begin("anthropic.messages")
	body, err := h.readBody(r)
	if err == nil {
		var tr translate.AnthropicRequest
		if tr, err = translate.FromAnthropicMessages(body); err == nil {
			req := anthropicDispatch(r, tr)
			obsOf(r).clientStreams(tr.Stream)
			if len(tr.Extension) > 0 {
				h.logger.Debug("Messages fields only Ollama providers take", "fields", tr.Extension)
			}
			var m *messagesRender // made once, by the first of the calls below
			render := func(rr *runResponse) *messagesRender {
				if m == nil {
					m = newMessagesRender(rr, tr)
				}
				return m
			}
			rend := runRenderer{
				writeError: h.writeAnthropicError,
				tunnel: func(rr *runResponse, info contract.DispatchInfo) string {
					return render(rr).dispatched(info).tunnel()
				},
				normalized: func(rr *runResponse, info contract.DispatchInfo) string {
					return render(rr).dispatched(info).normalized()
				},
			}
			if tr.Stream {
				// A ping every messagesPingInterval from the start, while
				// the request waits for its provider too.
				rend.quiet = func(rr *runResponse) error { return render(rr).quiet() }
				rend.quietInterval = messagesPingInterval
				rend.failed = func(rr *runResponse, err error) string { return render(rr).failed(err) }
			}
			h.serveRunWith(w, r, &req, rend)
			return
		}
	}
	h.writeAnthropicError(w, r, anthropicRequestError(err), nil)
}

// anthropicRequestError turns a translation's *translate.FieldError into
// this package's *requestError (400).
func anthropicRequestError(err error) error {
	var fe *translate.FieldError
	if errors.As(err, &fe) {
		return &requestError{param: fe.Field, message: fe.Message}
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
		req.RunID = newRunID()
	}
	for _, n := range []struct {
		on   bool
		need string
	}{{tr.Tools, needTools}, {tr.Vision, needVision},
		{tr.RemoteImages, needRemoteImages}, {tr.Thinking, needThinking}} {
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
func (h *handler) countTokens(w http.ResponseWriter, r *http.Request) {
	body, err := h.readBody(r)
	if err != nil {
		h.writeAnthropicError(w, r, err, nil)
		return
	}
	tr, err := translate.FromAnthropicCountTokens(body)
	if err != nil {
		h.writeAnthropicError(w, r, anthropicRequestError(err), nil)
		return
	}
	req := &contract.Request{Model: tr.Model}
	if _, err := h.resolveModel(r, tr.Model); err != nil {
		h.writeAnthropicError(w, r, err, req)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": tr.EstimatedInputTokens})
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
func anthropicError(err error, req *contract.Request) (e *apiError, status int, typ string) {
	e = classify(err, req)
	status = e.status
	if errors.Is(err, ErrCandidatesRejected) {
		// The edge words the tool_choice need in the chat API's terms;
		// a Messages client sent tool_choice "any".
		words := *e
		words.Message = strings.ReplaceAll(e.Message, `tool_choice "required" or parallel_tool_calls false`, `tool_choice "any"`)
		e = &words
	}
	switch {
	case errors.Is(err, ErrQueueFull), errors.Is(err, ErrQueueTimeout), errors.Is(err, ErrShed):
		return e, statusOverloaded, "overloaded_error"
	case errors.Is(err, ErrNoProvider), errors.Is(err, ErrProviderUnavailable):
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

// writeAnthropicError is writeError with Anthropic's status and error
// body, {"type":"error","error":{"type","message"}} (anthropicError).
func (h *handler) writeAnthropicError(w http.ResponseWriter, r *http.Request, err error, req *contract.Request) {
	if clientGone(r) && !errors.Is(err, errBodyTimeout) {
		h.logger.Debug("client gone before the answer", "path", clip(r.URL.Path), "err", errorText(err, req))
		obsOf(r).failed(err, nil, true)
		return
	}
	e, status, typ := anthropicError(err, req)
	obsOf(r).failed(err, e.Code, false)
	h.logError(r, e, err, req)
	answerFinished(r.Context()) // an error answer ends the request
	if e.retryAfter != "" {
		w.Header().Set("Retry-After", e.retryAfter)
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	writeJSON(w, status, translate.NewAnthropicError(typ, e.Message))
}
