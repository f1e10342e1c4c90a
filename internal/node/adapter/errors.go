package adapter

import (
	"errors"
	"fmt"
)

// Kinds of failure. An [*Error] unwraps to exactly one of the first seven;
// the rest are returned wrapped by adapter methods and constructors.
var (
	// ErrProviderStatus: the provider answered with a non-2xx status.
	ErrProviderStatus = errors.New("provider answered with an error status")
	// ErrProviderUnreachable: the request could not be sent or no answer
	// arrived (connection refused, reset before the head, DNS failure).
	ErrProviderUnreachable = errors.New("provider unreachable")
	// ErrProviderTimeout: the provider did not finish within the timeout.
	ErrProviderTimeout = errors.New("provider timed out")
	// ErrProviderStream: the provider broke its answer after the head: a
	// dropped connection, a stream that ended before done, an error line, a
	// line that does not parse.
	ErrProviderStream = errors.New("provider stream failed")
	// ErrBadRequest: the request body cannot be sent to this provider.
	ErrBadRequest = errors.New("bad request")
	// ErrProviderReported: a tunnel relayed a 2xx answer in full, but the
	// provider reported an error inside it (an SSE error event). The client
	// got the provider's bytes; the run failed all the same.
	ErrProviderReported = errors.New("provider reported an error in its stream")
	// ErrProviderError: the provider answered 2xx with an error object
	// before any of its answer was passed on: a JSON body that is an error
	// object ({"error":{...}} or {"error":"..."}), or a stream whose first
	// event (SSE) or line (NDJSON) is one. Nothing reached the client, so
	// the edge may try another provider.
	ErrProviderError = errors.New("provider answered with an error object")

	// ErrCancelled: the caller's context ended before the answer did.
	ErrCancelled = errors.New("run cancelled")
	// ErrSink: a sink refused an event or a chunk.
	ErrSink = errors.New("run sink failed")
	// ErrInvalidConfig: an adapter Config cannot be used.
	ErrInvalidConfig = errors.New("invalid adapter config")
)

// Error is a failed provider request, in terms safe to show a client.
type Error struct {
	// Kind is one of ErrProviderStatus, ErrProviderUnreachable,
	// ErrProviderTimeout, ErrProviderStream, ErrBadRequest,
	// ErrProviderReported, ErrProviderError.
	Kind error
	// Status is the HTTP status to report: the provider's own status for
	// ErrProviderStatus (502 when it was a redirect or out of range), 502
	// unreachable, stream failure, reported error or error object, 504
	// timeout, 400 bad request (413 for a body over the node's limit).
	Status int
	// Message describes the failure; it never holds the provider's URL or
	// API key. For ErrBadRequest with a Param it is "<param>: <what>".
	Message string
	// Param names the request field the adapter could not turn into its
	// provider's protocol (ErrBadRequest only), as in
	// "messages[0].content[1].image_url"; "" for the body as a whole or
	// another failure.
	Param string
	// ModelFailure says the failure is the served model's alone, not the
	// provider's (a managed provider's server for that model could not
	// start or exited): the provider's other models are unaffected, so no
	// circuit breaker counts it.
	ModelFailure bool
}

func (e *Error) Error() string {
	return fmt.Sprintf("%v (status %d): %s", e.Kind, e.Status, e.Message)
}

// Unwrap returns e.Kind so errors.Is(err, ErrProviderTimeout) etc. work.
func (e *Error) Unwrap() error { return e.Kind }
