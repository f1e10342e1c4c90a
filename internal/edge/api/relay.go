package api

import (
	"net/http"

	"iop/internal/edge/api/apierror"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
)

// The frame's relay for the API packages' routes (Config.Routes) that
// answer on the tunnel path only (package media): the request goes
// through the frame's admission (key, model access, quota, flow, queue,
// the key's slot given back once) and records (RequestRecord, usage
// ledger row, span, metrics), and the provider's answer is relayed byte
// for byte.

// Relay dispatches req, a request of a Config.Routes route, and relays
// its provider's answer unchanged (the tunnel path), as the frame's own
// routes do: api is the record's API name ("rerank", ...). A failed
// admission is answered in OpenAI's error shape with classify's status
// (404 unknown model, 400 naming a capability no provider has, 429, 503
// with Retry-After, 413 for a streamed body over its limit, ...); a run
// whose provider is on the normalized path (it cannot serve the route)
// is answered 400 unsupported_capability. Outside the frame (no frame in
// r's context) it answers 500.
//
// A request whose provider was never on the tunnel path cannot be
// relayed: Relay's caller sets a capability in req.Needs that only
// providers serving the endpoint advertise.
func Relay(w http.ResponseWriter, r *http.Request, api string, req contract.Request) {
	o := obsOf(r)
	if o == nil || o.h == nil {
		WriteJSON(w, http.StatusInternalServerError, apierror.Body{Error: apierror.New(http.StatusInternalServerError,
			"server_error", "", "internal_error", "Internal server error")})
		return
	}
	h := o.h
	o.get().Begin(api)
	if req.Headers == nil {
		req.Headers = ForwardHeaders(r.Header)
	}
	h.serveRun(w, r, &req, func(rr *Answer, _ contract.DispatchInfo) string {
		return rr.fail(&request.FieldError{Message: "the provider chosen for model " + Clip(req.Model) +
			" does not serve this endpoint: it is not on the tunnel path"})
	})
}
