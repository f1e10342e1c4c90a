package api

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"iop/internal/edge/api/bodycoding"
	"iop/internal/edge/contract"
	"iop/internal/modelname"
	"iop/internal/sse"
	"iop/internal/translate"
)

// What a client API that translates its own bodies (package ollama) needs
// of the frame beyond frame.go: its bodies read whatever their
// Content-Type, the OpenAI checks of what it translated, its error bodies
// and answer streams in its own content type.

// ErrModelManagement is the error of a route that would manage a model
// server's own models (create, copy, delete, push): Classify answers it
// 403 permission_error with the wrapping error's text.
var ErrModelManagement = errModelManagement

// ErrorsFor makes write answer the frame's own failures on the paths
// match reports true for, as Errors does for a root, for an API whose
// paths lie under no one root (Ollama's: "/" and "/api/...").
func (f *Frame) ErrorsFor(match func(path string) bool, write ErrorWriter) {
	f.h.errorRoots = append(f.h.errorRoots, errorRoot{match: match, write: write})
}

// ReadAnyBody reads a request's body whole, whatever its Content-Type.
// Errors as ReadBody's, but none for the Content-Type.
func (f *Frame) ReadAnyBody(r *http.Request) ([]byte, error) { return readAllBody(r) }

// Known reports whether Dispatch would resolve name rather than refuse it
// as unknown (Config.Known; false without it).
func (f *Frame) Known(name string) bool { return f.h.cfg.Known != nil && f.h.cfg.Known(name) }

// WriteErrorAsType is WriteErrorAs with the body's Content-Type.
func (f *Frame) WriteErrorAsType(w http.ResponseWriter, r *http.Request, err error, req *contract.Request, shape ErrorShape, contentType string) {
	f.h.writeShaped(w, r, err, req, shape, contentType)
}

// Allowed reports whether the request's key may use model (true on an
// open API).
func Allowed(r *http.Request, model string) bool { return allowed(r, model) }

// KnownModel returns the name in names that the model name name means:
// name itself, else its other spelling ("x" and "x:latest",
// modelname.Alternative); ok is false when neither is there.
func KnownModel(names []string, name string) (string, bool) { return knownModel(names, name) }

// WriteJSONAs answers with v as JSON, a newline, Content-Type contentType
// and its Content-Length.
func WriteJSONAs(w http.ResponseWriter, status int, contentType string, v any) {
	writeJSONAs(w, status, contentType, v)
}

// StartStreamAs sends the status line and headers of a streamed answer of
// Content-Type contentType (no caching, no proxy buffering), once.
func (rr *Answer) StartStreamAs(contentType string) {
	if rr.started {
		return
	}
	header := rr.w.Header()
	header.Set("Content-Type", contentType)
	header.Set("Cache-Control", "no-cache")
	header.Set("X-Accel-Buffering", "no")
	rr.w.WriteHeader(http.StatusOK)
	rr.started = true
}

// isOllamaPath reports whether path belongs to the Ollama API (package
// ollama), whose routes take a body of any Content-Type.
func isOllamaPath(path string) bool {
	return path == "/" || strings.HasPrefix(path, "/api/")
}

// knownModel returns the name in names that the Ollama model name means:
// name itself, else its other spelling (modelname.Alternative); ok is false when neither is there.
func knownModel(names []string, name string) (string, bool) {
	alt := modelname.Alternative(name)
	found := ""
	for _, n := range names {
		if n == name {
			return n, true
		}
		if alt != "" && n == alt {
			found = n
		}
	}
	return found, found != ""
}

// readAllBody reads a request body (ServeHTTP caps it at
// Config.MaxBodyBytes, decoded, and decodes its Content-Encoding).
// Errors: errBodyTooLarge, errBodyTimeout, an *encodingError, or a
// *requestError (also for a body not valid in its coding).
func readAllBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		if encErr, ok := errors.AsType[*encodingError](err); ok {
			return nil, encErr
		}
		if errors.Is(err, bodycoding.ErrCorrupt) {
			return nil, &requestError{message: bodycoding.ErrCorrupt.Error()}
		}
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, errBodyTooLarge
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, errBodyTimeout // Config.BodyReadTimeout
		}
		// Usually a client that went away mid-upload; then nothing is written.
		return nil, &requestError{message: "reading the request body failed"}
	}
	return body, nil
}

// tunnelAnswer reads a tunnel-path run to its end. A 2xx event stream is
// handed to onSSE as it arrives (stream is then true); with onSSE nil, or for
// any other 2xx answer, the body is returned whole. Errors: an
// *upstreamError with the provider's status and message for an error
// status or a tunnel failure, one of status 502 for a body over
// Config.MaxAnswerBytes, onSSE's error through streamError,
// ErrUpstreamProtocol or errUpstreamEnded for a run that breaks the
// tunnel's message order, and recv's errors.
func (rr *Answer) tunnelAnswer(onSSE func(data []byte) error) (stream bool, body []byte, err error) {
	status, retryAfter := 0, ""
	var next tunnelQueue
	for {
		ev, err := next.event(rr.recv)
		if err != nil {
			return false, nil, err
		}
		switch ev.Kind {
		case contract.EventHead:
			if status != 0 {
				return false, nil, ErrUpstreamProtocol
			}
			status = ev.Status
			if status < 200 || status > 599 {
				return false, nil, ErrUpstreamProtocol
			}
			for name, value := range ev.Headers {
				switch http.CanonicalHeaderKey(name) {
				case "Content-Type":
					stream = onSSE != nil && status < 300 && sse.IsEventStream(value)
				case "Retry-After":
					// The provider's, for the Ollama client as an OpenAI
					// client gets it.
					if _, err := strconv.Atoi(value); err == nil {
						retryAfter = value
					} else if _, err := http.ParseTime(value); err == nil {
						retryAfter = value
					}
				}
			}
		case contract.EventData:
			if status == 0 {
				return false, nil, ErrUpstreamProtocol
			}
			data := ev.Data
			if stream {
				if err := onSSE(data); err != nil {
					return false, nil, streamError(err)
				}
				continue
			}
			if int64(len(body)+len(data)) > rr.h.cfg.MaxAnswerBytes {
				return false, nil, &upstreamError{status: http.StatusBadGateway, message: "the provider's answer is too large"}
			}
			body = append(body, data...)
		case contract.EventEnd:
			if status == 0 {
				return false, nil, errUpstreamEnded
			}
			if status >= 300 {
				return false, nil, &upstreamError{status: status, message: clipTo(translate.DecodeOpenAIError(body), maxErrorTextBytes), retryAfter: retryAfter}
			}
			return stream, body, nil
		case contract.EventFailure:
			return false, nil, failureError(ev)
		default:
			return false, nil, ErrUpstreamProtocol
		}
	}
}

// streamError maps a decoding failure of a tunnel answer to this package's
// outcomes; a failed write to the client passes through.
func streamError(err error) error {
	var pe *translate.ProviderError
	switch {
	case errors.As(err, new(*errWrite)):
		return err
	case errors.As(err, &pe):
		return &upstreamError{status: http.StatusBadGateway, message: clipTo(pe.Error(), maxErrorTextBytes)}
	case errors.Is(err, translate.ErrStreamTruncated):
		return errUpstreamEnded
	default:
		return &upstreamError{status: http.StatusBadGateway, message: err.Error()}
	}
}
