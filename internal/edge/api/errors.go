package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"iop/internal/auth"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
	"iop/internal/quota"
)

// Dispatch outcomes a Gateway reports, by wrapping one of them (for example
// fmt.Errorf("%w: %w", api.ErrQueueFull, err)): the contract's errors
// (package edge/contract, which says each one's status), which the edge
// returns as they are. classify maps each to its HTTP status.
var (
	ErrUnknownModel        = contract.ErrUnknownModel        // 404
	ErrNoProvider          = contract.ErrNoProvider          // 503
	ErrCandidatesRejected  = contract.ErrCandidatesRejected  // 400, the text names the capability
	ErrQueueFull           = contract.ErrQueueFull           // 429
	ErrShed                = contract.ErrShed                // 429 with Retry-After
	ErrQueueTimeout        = contract.ErrQueueTimeout        // 503
	ErrProviderUnavailable = contract.ErrProviderUnavailable // 503
	ErrDispatchTimeout     = contract.ErrDispatchTimeout     // 502
	ErrDispatchRefused     = contract.ErrDispatchRefused     // 502
	ErrStaleGeneration     = contract.ErrStaleGeneration     // 502
	ErrNodeGone            = contract.ErrNodeGone            // 502
	ErrShuttingDown        = contract.ErrShuttingDown        // 503 with Retry-After; a started stream's error event
	ErrNoLeader            = contract.ErrNoLeader            // 503 with Retry-After (several edges, no leader reachable)

	// ErrInvalidConfig is returned (wrapped) by Config.Validate.
	ErrInvalidConfig = errors.New("invalid api config")
)

// Outcomes this package finds itself.
var (
	errNotFound         = errors.New("unknown url")
	errMethodNotAllowed = errors.New("method not allowed")
	errBodyTooLarge     = errors.New("request body too large")
	errBodyTimeout      = errors.New("the request body did not arrive in time")
	errUnsupportedMedia = errors.New("unsupported content type")
	// errModelManagement is an Ollama route that manages a model server's
	// models (copy, delete, create, push, blobs): 403, with why.
	errModelManagement   = errors.New("model management refused")
	errUpstreamEnded     = errors.New("upstream ended the response without completing it")
	ErrUpstreamProtocol  = errors.New("unexpected message from upstream")
	errUnknownPath       = errors.New("unknown execution path")
	errUpstreamCancelled = errors.New("upstream cancelled the run")
	errUpstreamLost      = errors.New("lost the connection to the node serving this request")
)

// requestError is a client request that cannot be served as sent: 400, with
// param naming the offending field ("" when the body as a whole is bad).
// Its Error text, "param: message", is the error body's message, so the
// message says which field is wrong even where a client shows only it.
type requestError struct {
	param   string
	message string
}

func (e *requestError) Error() string {
	if e.param == "" {
		return e.message
	}
	return e.param + ": " + e.message
}

// upstreamError is a failure the node reported for a run: a normalized or a
// tunnel failure event. status is the HTTP status the provider answered or
// the node chose (502 upstream failure, 504 timeout); 0 or out of range
// means 502.
// message is already safe to show a client.
type upstreamError struct {
	status  int
	message string
	// retryAfter is the provider's own Retry-After header, when its answer
	// had one (a tunnel's error head), for the client: "" otherwise.
	retryAfter string
}

func (e *upstreamError) Error() string { return e.message }

// APIError is an OpenAI error response: HTTP status, an optional Retry-After
// (seconds), and the body's fields.
type APIError struct {
	status     int
	retryAfter string
	Message    string  `json:"message"`
	Type       string  `json:"type"`
	Param      *string `json:"param"`
	Code       *string `json:"code"`
}

// errorBody is the OpenAI error shape, {"error":{...}}.
type errorBody struct {
	Error *APIError `json:"error"`
}

// Retry-After values, in seconds. A full queue frees up as soon as any run
// ends; a timed-out queue or a missing provider takes longer.
const (
	retryAfterQueueFull   = "1"
	retryAfterUnavailable = "5"
)

// classify is the one mapping from an outcome of this package or of the
// Gateway to an HTTP status and OpenAI error body. req, when not nil, is the
// request being served; messages may name its model (clipped) and needs.
// Messages never carry text from errors of unknown origin (they could hold
// provider addresses); upstream messages come from the node, which strips
// secrets.
func Classify(err error, req *contract.Request) *APIError {
	model := ""
	if req != nil {
		model = Clip(req.Model)
	}
	var (
		reqErr   *requestError
		fieldErr *request.FieldError
		upErr    *upstreamError
		limitErr *auth.LimitError
		quotaErr *quota.Refusal
	)
	switch {
	case errors.Is(err, errMissingKey):
		return newAPIError(http.StatusUnauthorized, "invalid_request_error", "", "missing_api_key",
			"Missing API key: send it as Authorization: Bearer KEY (or x-api-key: KEY)")
	case errors.Is(err, errWrongKey):
		// Never the key itself: it could be someone's secret typed into the wrong place.
		return newAPIError(http.StatusUnauthorized, "invalid_request_error", "", "invalid_api_key", "Incorrect API key provided")
	case errors.Is(err, errNotAdminKey), errors.Is(err, errAdminKeyOnAPI):
		return newAPIError(http.StatusForbidden, "invalid_request_error", "", "permission_denied", err.Error())
	case errors.Is(err, ErrModelNotAllowed):
		return newAPIError(http.StatusForbidden, "invalid_request_error", "model", "model_not_allowed",
			fmt.Sprintf("This API key may not use the model %q", model))
	case errors.As(err, &limitErr):
		code, what := "rate_limit_exceeded", fmt.Sprintf("%d requests per minute", limitErr.Max)
		if limitErr.Limit == "max_concurrent" {
			code, what = "concurrency_limit_exceeded", fmt.Sprintf("%d requests at once", limitErr.Max)
		}
		e := newAPIError(http.StatusTooManyRequests, "rate_limit_error", "", code,
			"This API key is over its limit of "+what+"; retry later")
		e.retryAfter = retryAfterSeconds(limitErr.RetryAfter)
		return e
	case errors.As(err, &quotaErr):
		return quotaError(quotaErr)
	case errors.As(err, &reqErr):
		return newAPIError(http.StatusBadRequest, "invalid_request_error", reqErr.param, "invalid_request", reqErr.Error())
	case errors.As(err, &fieldErr):
		return newAPIError(http.StatusBadRequest, "invalid_request_error", fieldErr.Field, "invalid_request", fieldErr.Error())
	case errors.Is(err, errNotFound):
		return newAPIError(http.StatusNotFound, "invalid_request_error", "", "unknown_url", err.Error())
	case errors.As(err, new(*notFoundError)):
		return newAPIError(http.StatusNotFound, "invalid_request_error", "", "not_found", err.Error())
	case errors.Is(err, errRunNotFound):
		return newAPIError(http.StatusNotFound, "invalid_request_error", "", "run_not_found", "No run has this id")
	case errors.Is(err, errMethodNotAllowed):
		return newAPIError(http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed", err.Error())
	case errors.Is(err, errBodyTimeout):
		return newAPIError(http.StatusRequestTimeout, "invalid_request_error", "", "request_timeout", err.Error())
	case errors.Is(err, errBodyTooLarge):
		return newAPIError(http.StatusRequestEntityTooLarge, "invalid_request_error", "", "request_too_large", err.Error())
	case errors.As(err, new(*encodingError)):
		return newAPIError(http.StatusUnsupportedMediaType, "invalid_request_error", "", "unsupported_content_encoding", err.Error())
	case errors.Is(err, errModelManagement):
		return newAPIError(http.StatusForbidden, "invalid_request_error", "", "model_management_refused", err.Error())
	case errors.Is(err, errUnsupportedMedia):
		return newAPIError(http.StatusUnsupportedMediaType, "invalid_request_error", "", "unsupported_media_type",
			"Content-Type must be application/json")
	case errors.Is(err, contract.ErrUnknownProvider):
		return newAPIError(http.StatusNotFound, "invalid_request_error", "", "provider_not_found", Clip(err.Error()))
	case errors.Is(err, contract.ErrResidencyConflict):
		return newAPIError(http.StatusConflict, "invalid_request_error", "", "residency_conflict", Clip(err.Error()))
	case errors.Is(err, ErrUnknownModel):
		msg := fmt.Sprintf("The model %q does not exist", model)
		if ua, ok := errors.AsType[*contract.UnmatchedAliasError](err); ok {
			// A configured alias whose targets no node serves: say which.
			msg = Clip(ua.Error())
		}
		return newAPIError(http.StatusNotFound, "invalid_request_error", "model", "model_not_found", msg)
	case errors.Is(err, ErrCandidatesRejected):
		return newAPIError(http.StatusBadRequest, "invalid_request_error", "", "unsupported_capability",
			rejectedMessage(err, req))
	case errors.Is(err, ErrShed):
		why := "a higher-priority request took its place in the queue"
		if errors.Is(err, contract.ErrExpectedWait) {
			why = "its expected queue time passes the queue timeout"
		}
		e := newAPIError(http.StatusTooManyRequests, "rate_limit_error", "", "shed",
			fmt.Sprintf("Sheddable request for model %q shed: %s; retry later", model, why))
		e.retryAfter = retryAfterUnavailable
		return e
	case errors.Is(err, ErrQueueFull):
		e := newAPIError(http.StatusTooManyRequests, "rate_limit_error", "", "queue_full",
			fmt.Sprintf("Too many requests queued for model %q; retry later", model))
		e.retryAfter = retryAfterQueueFull
		return e
	case errors.Is(err, ErrQueueTimeout):
		e := newAPIError(http.StatusServiceUnavailable, "server_error", "", "queue_timeout",
			fmt.Sprintf("No capacity for model %q became free in time; retry later", model))
		e.retryAfter = retryAfterUnavailable
		return e
	case errors.Is(err, ErrShuttingDown):
		e := newAPIError(http.StatusServiceUnavailable, "server_error", "", "edge_shutting_down",
			"The gateway is shutting down; retry")
		e.retryAfter = retryAfterUnavailable
		return e
	case errors.Is(err, ErrNoLeader):
		e := newAPIError(http.StatusServiceUnavailable, "server_error", "", "no_leader",
			"No scheduler leader is reachable from this gateway edge; retry")
		e.retryAfter = retryAfterQueueFull
		return e
	case errors.Is(err, ErrNoProvider), errors.Is(err, ErrProviderUnavailable):
		e := newAPIError(http.StatusServiceUnavailable, "server_error", "", "provider_unavailable",
			fmt.Sprintf("No provider for model %q is available; retry later", model))
		e.retryAfter = retryAfterUnavailable
		return e
	case errors.Is(err, contract.ErrProviderBusy):
		e := newAPIError(http.StatusServiceUnavailable, "server_error", "", "provider_busy",
			fmt.Sprintf("Every provider of model %q that was tried is busy with other requests; retry", model))
		e.retryAfter = retryAfterQueueFull
		return e
	case errors.Is(err, ErrDispatchTimeout), errors.Is(err, ErrDispatchRefused),
		errors.Is(err, ErrStaleGeneration), errors.Is(err, ErrNodeGone):
		return newAPIError(http.StatusBadGateway, "upstream_error", "", "upstream_unavailable",
			"The node serving this request failed: "+dispatchReason(err))
	case errors.As(err, &upErr):
		status := upErr.status
		if status < 400 || status > 599 {
			status = http.StatusBadGateway
		}
		msg := upErr.message
		if msg == "" {
			msg = http.StatusText(status)
		}
		switch {
		case status == http.StatusGatewayTimeout:
			return newAPIError(status, "upstream_error", "", "upstream_timeout", msg)
		case status == http.StatusTooManyRequests:
			e := newAPIError(status, "rate_limit_error", "", "upstream_rate_limited", msg)
			e.retryAfter = upErr.retryAfter
			return e
		case status < 500:
			return newAPIError(status, "invalid_request_error", "", "upstream_rejected", msg)
		default:
			return newAPIError(status, "upstream_error", "", "upstream_error", msg)
		}
	case errors.Is(err, errUpstreamEnded), errors.Is(err, ErrUpstreamProtocol), errors.Is(err, errUpstreamCancelled):
		return newAPIError(http.StatusBadGateway, "upstream_error", "", "upstream_error", err.Error())
	case errors.Is(err, errUpstreamLost):
		// Not err.Error(): the wrapped Recv error may name addresses.
		return newAPIError(http.StatusBadGateway, "upstream_error", "", "upstream_error", errUpstreamLost.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return newAPIError(http.StatusGatewayTimeout, "upstream_error", "", "upstream_timeout", "The request timed out")
	default:
		// Also errUnknownPath, and a Recv or Dispatch error of unknown
		// origin: the text stays in the log.
		return newAPIError(http.StatusInternalServerError, "server_error", "", "internal_error", "Internal server error")
	}
}

func newAPIError(status int, typ, param, code, message string) *APIError {
	e := &APIError{status: status, Message: message, Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

// rejectedMessage is the message of a 400 for ErrCandidatesRejected: the
// gateway's text (which names the missing capability) without the sentinel's
// own prefix, and the request's needs when that text names none of them.
func rejectedMessage(err error, req *contract.Request) string {
	msg := errorText(err, req)
	for strings.HasPrefix(msg, ErrCandidatesRejected.Error()+": ") {
		msg = strings.TrimPrefix(msg, ErrCandidatesRejected.Error()+": ")
	}
	if req == nil || len(req.Needs) == 0 {
		return msg
	}
	for _, need := range req.Needs {
		if strings.Contains(msg, need) {
			return msg
		}
	}
	return fmt.Sprintf("%s (the request needs: %s)", msg, strings.Join(req.Needs, ", "))
}

// dispatchReason names a dispatch failure without the wrapped details.
func dispatchReason(err error) string {
	for _, s := range []error{ErrDispatchTimeout, ErrDispatchRefused, ErrStaleGeneration, ErrNodeGone} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	return "unknown"
}

// maxErrorTextBytes bounds the text of an error that may embed client
// values among other words (a gateway error naming the model), in a log
// line or a message; one client value alone is clipped to
// request.MaxQuotedBytes (Clip).
const maxErrorTextBytes = 1024

// Clip is request.Clip: s cut to at most request.MaxQuotedBytes bytes of
// valid UTF-8, ending in "…" when it was cut.
func Clip(s string) string { return request.Clip(s) }

// clipTo is request.ClipTo: Clip with a bound of limit bytes.
func clipTo(s string, limit int) string { return request.ClipTo(s, limit) }

// errorText is err's text for a log line or a message: the request's model
// name, wherever the text quotes it, clipped; the whole text clipped to
// maxErrorTextBytes.
func errorText(err error, req *contract.Request) string {
	text := err.Error()
	if req != nil {
		if short := Clip(req.Model); short != req.Model {
			text = strings.ReplaceAll(text, strconv.Quote(req.Model), strconv.Quote(short))
			text = strings.ReplaceAll(text, req.Model, short)
		}
	}
	return clipTo(text, maxErrorTextBytes)
}
