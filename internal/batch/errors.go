package batch

import "errors"

// MissingError is a request that leaves out a required parameter:
// ErrInvalid (400), with OpenAI's code missing_required_parameter.
type MissingError struct{ Param string }

func (e *MissingError) Error() string {
	return ErrInvalid.Error() + ": " + e.Param + ": missing required parameter"
}

// Is makes a MissingError an ErrInvalid.
func (e *MissingError) Is(target error) bool { return target == ErrInvalid }

// Errors of the batch service; the HTTP layer maps each to one status
// (package edge/api/batch, writeError).
var (
	// ErrNotFound is a file or batch id the owner has none of (404).
	ErrNotFound = errors.New("not found")
	// ErrInvalid is a request the service refuses as malformed (400).
	ErrInvalid = errors.New("invalid request")
	// ErrTooLarge is an uploaded file over Config.MaxFileBytes (413).
	ErrTooLarge = errors.New("file too large")
	// ErrState is an operation the batch's status does not allow, such
	// as cancelling a completed batch (409).
	ErrState = errors.New("not allowed in this status")
	// ErrBodyRead is an upload that failed reading the client's bytes (a
	// malformed or cut multipart body), not storing them (Stage).
	ErrBodyRead = errors.New("reading the upload failed")
	// ErrClosed is a call after Close (503).
	ErrClosed = errors.New("batch service closed")
	// ErrLeaseLost is a runner's write after another service claimed the
	// batch (Store.UpdateBatch); the runner stops.
	ErrLeaseLost = errors.New("batch lease lost")
)
