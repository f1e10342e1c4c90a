package api

import (
	"context"

	"iop/internal/auth"
)

// internalCall marks a request the edge makes to its own API on behalf
// of a client (a batch's line): it runs as caller, without a credential,
// at priority.
type internalCall struct {
	caller   *auth.Caller
	priority int
}

type internalCallKey struct{}

// WithInternalCaller returns ctx for a request the edge serves to itself
// (http.Handler.ServeHTTP in the same process) on behalf of caller: the
// frame takes caller as the request's authenticated key (nil for an open
// API; its limits and model list apply as to the key's own requests) and
// dispatches the request at priority (contract.Priority*). A request
// from the network cannot carry it.
func WithInternalCaller(ctx context.Context, caller *auth.Caller, priority int) context.Context {
	return context.WithValue(ctx, internalCallKey{}, &internalCall{caller: caller, priority: priority})
}

// internalOf is ctx's internal call, nil for a client's request.
func internalOf(ctx context.Context) *internalCall {
	ic, _ := ctx.Value(internalCallKey{}).(*internalCall)
	return ic
}
