package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"iop/internal/auth"
	"iop/internal/batch"
	"iop/internal/edge/api"
)

// Paths of the routes.
const (
	filesPath    = "/v1/files"
	batchesPath  = "/v1/batches"
	messagesPath = "/v1/messages/batches"
)

// server serves the files, batches and message batches routes. Its
// fields are set by Routes and only read after.
type server struct {
	svc    *batch.Service
	logger *slog.Logger
}

// Routes returns the routes of the files, batches and message batches
// APIs over svc, for api.Config.Routes: the ones ending in "/" serve the
// paths under an id. logger may be nil.
func Routes(svc *batch.Service, logger *slog.Logger) map[string]api.Route {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &server{svc: svc, logger: logger.With("component", "edge-batch")}
	return map[string]api.Route{
		filesPath:          {Method: "", Serve: s.files},
		batchesPath:        {Method: "", Serve: s.batches},
		messagesPath:       {Method: "", Serve: s.messageBatches},
		adminPath:          {Method: http.MethodGet, Serve: s.progress},
		filesPath + "/":    {Method: "", Serve: s.file},
		batchesPath + "/":  {Method: "", Serve: s.batch},
		messagesPath + "/": {Method: "", Serve: s.messageBatch},
	}
}

// owner is the name of the request's key, "" on an open API.
func owner(ctx context.Context) string {
	if c := auth.FromContext(ctx); c != nil {
		return c.Name()
	}
	return ""
}

// split is the path's segments after prefix ("" segments dropped).
func split(path, prefix string) []string {
	var out []string
	for seg := range strings.SplitSeq(strings.TrimPrefix(path, prefix), "/") {
		if seg != "" {
			out = append(out, seg)
		}
	}
	return out
}

// problem is an error answer's status and OpenAI fields.
type problem struct {
	status           int
	typ, code, param string
	message          string
}

// problemOf is the one mapping from the batch service's errors to an
// answer: 404 not found, 400 invalid, 413 too large, 409 a status that
// does not allow the call, 503 closed; anything else 500 without its text.
func problemOf(err error) problem {
	var tooBig *http.MaxBytesError
	if te, ok := errors.AsType[*typeError](err); ok {
		return problem{http.StatusBadRequest, "invalid_request_error", "invalid_type", te.param, te.Error()}
	}
	if m, ok := errors.AsType[*batch.MissingError](err); ok {
		return problem{http.StatusBadRequest, "invalid_request_error", "missing_required_parameter", m.Param,
			fmt.Sprintf("Missing required parameter: '%s'.", m.Param)}
	}
	switch {
	case errors.Is(err, batch.ErrNotFound):
		return problem{http.StatusNotFound, "invalid_request_error", "not_found", "", err.Error()}
	case errors.Is(err, batch.ErrInvalid):
		msg := strings.TrimPrefix(err.Error(), batch.ErrInvalid.Error()+": ")
		param, _, _ := strings.Cut(msg, ":")
		if strings.ContainsAny(param, " \"") {
			param = ""
		}
		return problem{http.StatusBadRequest, "invalid_request_error", "invalid_value", param, msg}
	case errors.Is(err, batch.ErrTooLarge), errors.As(err, &tooBig):
		return problem{http.StatusRequestEntityTooLarge, "invalid_request_error", "file_too_large", "file", "The file is too large."}
	case errors.Is(err, batch.ErrState):
		return problem{http.StatusConflict, "invalid_request_error", "invalid_state", "", err.Error()}
	case errors.Is(err, batch.ErrClosed):
		return problem{http.StatusServiceUnavailable, "server_error", "unavailable", "", "The batch service is stopping; retry."}
	}
	return problem{http.StatusInternalServerError, "server_error", "internal_error", "", "Internal server error"}
}

// writeError answers err in OpenAI's error shape.
func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemOf(err)
	if p.status >= 500 {
		s.logger.Error("batch API request failed", "path", r.URL.Path, "err", err)
	}
	nullable := func(v string) *string {
		if v == "" {
			return nil
		}
		return &v
	}
	if p.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "5")
	}
	api.WriteJSON(w, p.status, map[string]any{"error": map[string]any{
		"message": p.message, "type": p.typ, "param": nullable(p.param), "code": nullable(p.code)}})
}

// writeAnthropicError answers err in Anthropic's error shape.
func (s *server) writeAnthropicError(w http.ResponseWriter, r *http.Request, err error) {
	p := problemOf(err)
	if p.status >= 500 {
		s.logger.Error("message batches request failed", "path", r.URL.Path, "err", err)
	}
	typ := map[int]string{http.StatusNotFound: "not_found_error", http.StatusRequestEntityTooLarge: "request_too_large",
		http.StatusServiceUnavailable: "overloaded_error", http.StatusInternalServerError: "api_error"}[p.status]
	if typ == "" {
		typ = "invalid_request_error"
	}
	if p.status == http.StatusConflict {
		p.status = http.StatusBadRequest // Anthropic's error table has no 409
	}
	api.WriteJSON(w, p.status, map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": p.message}})
}

// methodNotAllowed answers a method the path does not take.
func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	api.WriteJSON(w, http.StatusMethodNotAllowed, map[string]any{"error": map[string]any{
		"message": "Method not allowed", "type": "invalid_request_error", "param": nil, "code": "method_not_allowed"}})
}

// limitParam reads the query parameter limit: def when absent, and
// within [1, hi].
func limitParam(r *http.Request, def, hi int) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > hi {
		return 0, fmt.Errorf("%w: limit: must be an integer from 1 to %d", batch.ErrInvalid, hi)
	}
	return n, nil
}

// decodeJSON reads r's body as v. A field of the wrong JSON type is
// ErrInvalid naming the field (its dotted path, the error's param).
func decodeJSON(r *http.Request, v any) error {
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		if tooBig, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return tooBig
		}
		if te, ok := errors.AsType[*json.UnmarshalTypeError](err); ok && te.Field != "" {
			return &typeError{param: te.Field, want: jsonKind(te.Type), got: te.Value}
		}
		return fmt.Errorf("%w: the body is not a valid JSON object", batch.ErrInvalid)
	}
	return nil
}

// typeError is a body field of the wrong JSON type: 400 invalid_type, as
// OpenAI answers one ("Invalid type for 'x': expected a string, but got
// an integer instead.").
type typeError struct{ param, want, got string }

func (e *typeError) Error() string {
	return fmt.Sprintf("Invalid type for '%s': expected %s, but got %s instead.", e.param, e.want, article(e.got))
}

// article is a JSON value kind encoding/json names ("number", "string",
// "object", "array", "bool") with its article.
func article(kind string) string {
	switch kind {
	case "object", "array":
		return "an " + kind
	case "bool":
		return "a boolean"
	}
	return "a " + kind
}

// jsonKind names the JSON value a Go type decodes from, with an article.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Bool:
		return "a boolean"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "a number"
}

// unix is t as Unix seconds, nil when t is zero.
func unix(t interface {
	IsZero() bool
	Unix() int64
}) any {
	if t.IsZero() {
		return nil
	}
	return t.Unix()
}
