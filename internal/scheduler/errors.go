package scheduler

import "errors"

// Admission outcomes. Callers map them to API errors with errors.Is; every
// error the scheduler returns wraps exactly one of them (or a context error),
// but for ErrShed, which comes with its reason: ErrDisplaced or
// ErrExpectedWait.
var (
	// ErrUnknownModel: the requested model is neither an alias nor a served model.
	ErrUnknownModel = errors.New("unknown model")
	// ErrNoProvider: the model is known but no live provider serves it.
	ErrNoProvider = errors.New("no provider for model")
	// ErrProviderAway: beside ErrNoProvider, a resolver's word that the
	// providers that serve the model are away for now (their node drains
	// or just went): with a reconnect grace the request is queued, without
	// a candidate, for one to come back (Policy.ReconnectGrace).
	ErrProviderAway = errors.New("its providers are away for now (draining or reconnecting)")
	// ErrCandidatesRejected: providers exist but the request-local predicate
	// rejected every one (e.g. none has a capability the request needs).
	// Only at admission: a queued request whose resolver says so later fails
	// with ErrProviderUnavailable.
	ErrCandidatesRejected = errors.New("no candidate accepts the request")
	// ErrQueueFull: every candidate is busy and the group's queue holds max_queue waiters.
	ErrQueueFull = errors.New("queue full")
	// ErrQueueTimeout: the request waited the group's queue_timeout without a slot.
	ErrQueueTimeout = errors.New("queue timeout")
	// ErrProviderUnavailable: while the request waited, every candidate (or
	// every one meeting its needs) went away; or its resolver says so at
	// admission.
	ErrProviderUnavailable = errors.New("provider unavailable")
	// ErrShed: a sheddable request was shed: displaced from its group's full
	// queue by a higher-priority arrival (ErrDisplaced, while it waited), or
	// refused at arrival because its expected queue time passes its queue
	// timeout (ErrExpectedWait). Every ErrShed error wraps one of the two.
	ErrShed = errors.New("shed")
	// ErrDisplaced: see ErrShed.
	ErrDisplaced = errors.New("displaced by a higher-priority request")
	// ErrExpectedWait: see ErrShed.
	ErrExpectedWait = errors.New("expected queue time passes the queue timeout")
	// ErrInvalid: a constructor or update got an invalid argument; state is unchanged.
	ErrInvalid = errors.New("invalid argument")
	// ErrUnknownResource: no resource exists for the (node, provider) named.
	ErrUnknownResource = errors.New("unknown resource")
)
