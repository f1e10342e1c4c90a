package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"

	"iop/internal/edge/api/stream"
)

// ErrRunNotFound is the error of a run id the request's key has no run
// of: WriteError answers it 404 invalid_request_error, code
// run_not_found.
var ErrRunNotFound = errRunNotFound

// maxErrorBody caps the error body a detached answer keeps
// (Detached.ErrorBody).
const maxErrorBody = 64 << 10

// ErrUpstreamEnded is the failure of a provider's answer that ended
// without completing: WriteError answers it 502.
var ErrUpstreamEnded = errUpstreamEnded

// errRunNotFound: no run has the requested id. 404.
var errRunNotFound = errors.New("run not found")

// CheckModel refuses a model the key of the request whose context is ctx
// may not use: ErrModelNotAllowed (403); nil on an open API.
func CheckModel(ctx context.Context, model string) error { return checkModel(ctx, model) }

// RelayRecorded relays a tunnel-path run as the chat route does (the
// provider's status, headers and bytes; the bytes that end the answer
// held until its end) and tells record of each event of an event stream
// once the bytes that complete it are released (stream.FinalHold.Record),
// and of the error event a started stream that fails ends with: record
// gets what a client of the chat route reads. It returns the rendering's
// reason.
func (rr *Answer) RelayRecorded(record func(stream.Event)) string {
	rr.recorder = record
	return rr.tunnel()
}

// recordError tells the answer's recorder, if any, of the error event e
// that ends a started stream.
func (rr *Answer) recordError(e *APIError) {
	if rr.recorder != nil {
		b, _ := json.Marshal(errorBody{Error: e})
		rr.recorder(stream.ReadEvent(b))
	}
}

// NewRunID returns a new run id: "run_" and 32 random hex digits.
func NewRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go ≥ 1.24)
	return "run_" + hex.EncodeToString(b[:])
}
