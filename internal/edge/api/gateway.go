package api

import (
	"context"

	"iop/internal/edge/contract"
)

// Gateway is what the HTTP API needs of the edge service: dispatch one
// request to a provider, and list the model names clients may ask for.
// Its types are the contract's (package edge/contract), which the edge's
// *edge.Service uses too; R is its run type (*edge.Run there). The
// service's optional features are Config's fields (Admin, Catalog,
// Shower, Known), each off when nil.
type Gateway[R Run] interface {
	// Dispatch admits req through its model's queue and sends it to exactly
	// one provider. It blocks while the request is queued and returns when
	// the run is dispatched, the admission fails, or ctx ends (then with
	// ctx's error). A failed admission wraps one of the contract's errors
	// (aliased in errors.go): ErrUnknownModel,
	// ErrNoProvider, ErrCandidatesRejected, ErrQueueFull, ErrShed (with
	// ErrDisplaced or ErrExpectedWait), ErrQueueTimeout,
	// ErrProviderUnavailable, ErrDispatchTimeout, ErrDispatchRefused,
	// ErrStaleGeneration or ErrNodeGone; any other error is answered 500.
	// req's Flow, Weight and Priority are set by the handler (assignFlow)
	// and order the model's queue.
	Dispatch(ctx context.Context, req contract.Request) (R, error)
	// Models lists the model names (aliases and served names) clients may
	// request, in the order to show them.
	Models() []string
}

// Run is one dispatched request, from dispatch to release.
type Run interface {
	// Info describes where the run was dispatched. It does not change.
	Info() contract.DispatchInfo
	// Recv blocks for the next message from the node, decoded by the edge
	// into typed events (contract.Message): a normalized run's deltas,
	// usage, end or failure; a tunnel run's head, data, end or failure.
	// When it returns a message that ends the run (Message.Ends) or an
	// error, the run has ended: its lease is already released. After such
	// a message it returns io.EOF. Cancel makes a blocked Recv return
	// promptly (io.EOF or an error). Any other error means the run failed
	// upstream: the node disconnected (wrap ErrNodeGone for a clearer
	// message) or its run stream broke; it is answered 502 without the
	// error's text.
	Recv() (contract.Message, error)
	// Cancel ends the run if it has not ended: cancels it on the node and
	// releases its lease. The reason is for logs only. It is idempotent and
	// safe to call from another goroutine while Recv blocks.
	Cancel(reason string)
	// Fail ends the run as Cancel does, as its provider's failure: the
	// API found the provider's answer broken (an error object inside its
	// 2xx stream, an answer it cannot decode or that breaks the
	// protocol). Unless a message of the run already told the edge how
	// the provider did, it counts against the provider's circuit breaker.
	Fail(reason string)
	// Close ends the run as Cancel does if it has not ended, and reports
	// the outcome of the request it served (one of the Outcome* values, as
	// its RequestRecord says), for the edge's record of the run's end. The
	// request goroutine calls it exactly once, when the answer is finished.
	Close(outcome contract.Outcome)
}

// widened is a Gateway of any run type as the Gateway[Run] the handler
// calls.
type widened[R Run] struct{ gw Gateway[R] }

func (w widened[R]) Dispatch(ctx context.Context, req contract.Request) (Run, error) {
	run, err := w.gw.Dispatch(ctx, req)
	if err != nil {
		return nil, err // never a Run holding a nil R
	}
	return run, nil
}

func (w widened[R]) Models() []string { return w.gw.Models() }
