package contract

import (
	"context"
	"errors"
	"strings"
)

// UnmatchedAliasError is the unknown-model outcome (it wraps
// ErrUnknownModel: 404) of a configured alias none of whose targets any node
// serves, or served less than the edge remembers (a misspelt target, a
// model no node has): a config mistake, not an outage. Alias is the alias,
// Targets its targets, in config order.
type UnmatchedAliasError struct {
	Alias   string
	Targets []string
}

// Error is "alias X: no configured target is served by any node: a, b".
func (e *UnmatchedAliasError) Error() string {
	return "alias " + e.Alias + ": no configured target is served by any node: " + strings.Join(e.Targets, ", ")
}

// Unwrap makes it match ErrUnknownModel.
func (e *UnmatchedAliasError) Unwrap() error { return ErrUnknownModel }

// Errors a dispatch fails with: Gateway.Dispatch returns one of them
// wrapped (with the edge's or the scheduler's details after it), and a
// run's Recv returns ErrNodeGone or ErrShuttingDown wrapped. The edge
// wraps its scheduler's errors with these once, at its boundary; the HTTP
// API's classify maps each to its status (in the comments) and error body.
var (
	// ErrUnknownModel: no alias or served model has the requested name. 404.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNoProvider: the model is known but no live provider serves it
	// (or every one is out of rotation). 503.
	ErrNoProvider = errors.New("no provider for model")
	// ErrCandidatesRejected: providers exist but none the edge knows has a
	// capability the request needs; the wrapped text names it. 400.
	ErrCandidatesRejected = errors.New("candidates rejected")
	// ErrQueueFull: every candidate is busy and the model's queue is full. 429.
	ErrQueueFull = errors.New("queue full")
	// ErrShed: a sheddable request was shed: displaced from its model's
	// full queue by a higher-priority one, or refused because its expected
	// queue time passes its queue timeout. 429 with Retry-After.
	ErrShed = errors.New("shed")
	// ErrDisplaced and ErrExpectedWait say why a request was shed; an
	// ErrShed error wraps one of them.
	ErrDisplaced    = errors.New("displaced by a higher-priority request")
	ErrExpectedWait = errors.New("expected queue time passes the queue timeout")
	// ErrQueueTimeout: the request waited the queue timeout without a slot. 503.
	ErrQueueTimeout = errors.New("queue timeout")
	// ErrProviderUnavailable: while the request waited, every candidate went
	// away; or the providers that could meet its needs are gone or
	// unavailable for now (they may come back). 503.
	ErrProviderUnavailable = errors.New("provider unavailable")
	// ErrDispatchTimeout: the node did not open the run's stream within
	// dispatch_timeout. 502.
	ErrDispatchTimeout = errors.New("dispatch timeout")
	// ErrDispatchRefused: the node answered the dispatch with
	// DispatchRefused. 502.
	ErrDispatchRefused = errors.New("dispatch refused")
	// ErrProviderBusy, beside ErrDispatchRefused: the node refused because
	// its provider already runs its capacity there (DispatchRefused.busy:
	// another edge's runs). The provider is healthy: 503 provider_busy with
	// Retry-After, not a circuit-breaker failure.
	ErrProviderBusy = errors.New("provider busy")
	// ErrStaleGeneration: the node reconnected between admission and
	// dispatch (twice in a row). 502.
	ErrStaleGeneration = errors.New("stale generation")
	// ErrNodeGone: the node connection a run was dispatched on ended (or
	// the node dropped the run's stream) before the run ended. 502.
	ErrNodeGone = errors.New("node gone")
	// ErrShuttingDown: the edge is stopping; the request was refused or
	// dequeued, or its run ended, before it finished. 503 with
	// Retry-After (another edge, or this one restarted, may serve it); a
	// stream that had started ends with this error event.
	ErrShuttingDown = errors.New("edge shutting down")
	// ErrNoLeader: several edges (cluster), and no scheduler leader could
	// be reached within a bound (none elected yet, or this edge is cut off
	// from it). 503 with Retry-After.
	ErrNoLeader = errors.New("no scheduler leader")
)

// Errors of a load or unload on a named provider (the admin calls): the
// HTTP API's classify maps each to its status.
var (
	// ErrUnknownProvider: no connected node has that id, or its provider
	// that id, or the provider does not serve the model. 404.
	ErrUnknownProvider = errors.New("unknown provider")
	// ErrResidencyConflict: the provider cannot load or unload the model
	// now: its server holds its models always (not an Ollama), or refused
	// or did not answer. 409.
	ErrResidencyConflict = errors.New("cannot load or unload the model there")
)

// Outcome is how one API request ended, decided once when it ended. The
// log line ("outcome"), the metrics (label outcome of
// iop_requests_total), the usage ledger, the run's RunEnded event and
// the runs API's record all carry this same value, as its string.
type Outcome string

// Outcomes. The strings are part of iop's interface: clients of the runs
// API, the ledger's rows and dashboards read them.
const (
	// OutcomeCompleted: the whole answer was written.
	OutcomeCompleted Outcome = "completed"
	// OutcomeInvalidRequest: refused as invalid: before admission (bad
	// body, size, content type, route), or by the node, which could not
	// translate it for its provider.
	OutcomeInvalidRequest Outcome = "invalid_request"
	// OutcomeRefused: admission or dispatch failed (queue full, queue
	// timeout, unavailable, rejected, unknown model, dispatch failed: the
	// record's Admission says which), or a key's limit refused it (its
	// ErrorCode says which).
	OutcomeRefused Outcome = "refused"
	// OutcomeUpstreamError: the provider or node failed after dispatch.
	OutcomeUpstreamError Outcome = "upstream_error"
	// OutcomeClientGone: the client went away first.
	OutcomeClientGone Outcome = "client_gone"
	// OutcomeWriteFailed: writing to the client failed.
	OutcomeWriteFailed Outcome = "write_failed"
	// OutcomeError: anything else (answered 500).
	OutcomeError Outcome = "error"
	// OutcomeEdgeStopped: the edge stopped before the answer was finished.
	OutcomeEdgeStopped Outcome = "edge_stopped"
)

// String is the outcome's label: the log line's "outcome", the metrics'
// outcome label, the ledger's and the runs API's outcome.
func (o Outcome) String() string { return string(o) }

// Admission is how one API request's admission went, decided with its
// Outcome: a slot was free, it waited, or why it was refused. The log
// line ("queue_reason"), the metrics (label reason of
// iop_admissions_total), the events stream's refusals and the
// RequestRecord carry this same value, as its string; "" (AdmissionNone)
// when the request never reached admission (refused as invalid).
type Admission string

// Admissions (DESIGN.md "The scheduler"). The strings are part of iop's
// interface, like the Outcomes': metrics labels and the dashboard read them.
const (
	AdmissionNone           Admission = ""
	AdmissionImmediate      Admission = "immediate"       // a slot was free
	AdmissionQueued         Admission = "queued"          // the request waited for a slot
	AdmissionQueueFull      Admission = "queue_full"      // 429: the model's queue was full
	AdmissionShed           Admission = "shed"            // 429: a sheddable request shed for a higher one, or for its expected wait
	AdmissionQueueTimeout   Admission = "queue_timeout"   // 503: no slot within the queue timeout
	AdmissionRejected       Admission = "rejected"        // 400: no provider has a capability the request needs
	AdmissionUnavailable    Admission = "unavailable"     // 503: no live provider serves the model
	AdmissionUnknownModel   Admission = "unknown_model"   // 404: no such model
	AdmissionDispatchFailed Admission = "dispatch_failed" // 502: admitted, but no node started the run (after the one retry)
	AdmissionCancelled      Admission = "cancelled"       // the client left while the request was queued or being dispatched
)

// ShedReason is why a request was shed, for the reason label of
// iop_flow_sheds_total: "displaced" or "expected_wait"; "" when err is no
// ErrShed.
func ShedReason(err error) string {
	switch {
	case !errors.Is(err, ErrShed):
		return ""
	case errors.Is(err, ErrDisplaced):
		return "displaced"
	case errors.Is(err, ErrExpectedWait):
		return "expected_wait"
	}
	return "shed"
}

// String is the admission's label.
func (a Admission) String() string { return string(a) }

// AdmissionOf is the admission of a failed Dispatch, from the error it
// returned (one of this package's errors wrapped, or the caller's context
// error); AdmissionNone for an error that is none of them. It is the one
// mapping from dispatch errors to admissions.
func AdmissionOf(err error) Admission {
	switch {
	case errors.Is(err, ErrShed):
		return AdmissionShed
	case errors.Is(err, ErrQueueFull):
		return AdmissionQueueFull
	case errors.Is(err, ErrQueueTimeout):
		return AdmissionQueueTimeout
	case errors.Is(err, ErrCandidatesRejected):
		return AdmissionRejected
	case errors.Is(err, ErrNoProvider), errors.Is(err, ErrProviderUnavailable), errors.Is(err, ErrShuttingDown), errors.Is(err, ErrNoLeader):
		return AdmissionUnavailable
	case errors.Is(err, ErrUnknownModel):
		return AdmissionUnknownModel
	case errors.Is(err, ErrDispatchTimeout), errors.Is(err, ErrDispatchRefused),
		errors.Is(err, ErrStaleGeneration), errors.Is(err, ErrNodeGone):
		return AdmissionDispatchFailed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return AdmissionCancelled
	}
	return AdmissionNone
}
