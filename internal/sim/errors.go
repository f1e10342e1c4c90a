package sim

import (
	"errors"
	"net/http"
)

// ErrInvalidConfig is returned (wrapped) by Config.Validate and New when the
// configuration cannot be served.
var ErrInvalidConfig = errors.New("invalid simulator config")

// Outcomes of a request that are answered with an error. Each protocol
// writes them in its own error shape; statusOf maps them to an HTTP status.
var (
	errInvalidRequest = errors.New("invalid request")
	errBodyTooLarge   = errors.New("request body too large")
	errUnauthorized   = errors.New("incorrect api key provided")
	errUnknownModel   = errors.New("model not found")
	errNotFound       = errors.New("not found")
	errOverCapacity   = errors.New("too many concurrent requests")
	errInjectedFault  = errors.New("injected fault")
	// errStreamFault is the error a stream reports with Faults.StreamErrorAfter.
	errStreamFault = errors.New("injected stream error: generation failed")
)

// statusOf is the one mapping from a request outcome to the HTTP status it
// is answered with. faultStatus is Config.Faults.ErrorStatus.
func statusOf(err error, faultStatus int) int {
	switch {
	case errors.Is(err, errInvalidRequest):
		return http.StatusBadRequest
	case errors.Is(err, errUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, errUnknownModel), errors.Is(err, errNotFound):
		return http.StatusNotFound
	case errors.Is(err, errBodyTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errOverCapacity):
		return http.StatusTooManyRequests
	case errors.Is(err, errInjectedFault):
		return faultStatus
	default:
		return http.StatusInternalServerError
	}
}
