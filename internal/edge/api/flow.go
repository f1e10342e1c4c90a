package api

import (
	"context"
	"net/http"

	"iop/internal/auth"
	"iop/internal/edge/api/access"
	"iop/internal/edge/api/request"
	"iop/internal/edge/contract"
)

var errBadPriority = &request.FieldError{Field: access.PriorityHeader, Message: "must be one of critical, standard, sheddable"}

// assignFlow sets req's flow, weight and priority before its dispatch:
// the flow is the key's name, or the value of the header or body field
// Config.Flow names where the request has one (access.FlowName); the
// weight is the key's; the priority the key's, or the header's where the
// key allows it (auth.Caller.Priority). An open API's requests are of the
// default flow "" with weight 1 and standard priority, unless the flow
// source names them. header is nil for a run of the runs API (no client
// headers): its flow is its key's. It returns errBadPriority (400) for a
// priority header the key allows that names no priority.
func (h *handler) assignFlow(ctx context.Context, header http.Header, req *contract.Request, obs *observation) error {
	req.Weight, req.Priority = 1, contract.PriorityStandard
	if c := auth.FromContext(ctx); c != nil {
		rank, ok := c.Priority(header.Get(access.PriorityHeader))
		if !ok {
			return errBadPriority
		}
		req.Flow, req.Weight, req.Priority = c.Name(), c.Weight(), rank
	}
	if ic := internalOf(ctx); ic != nil {
		req.Priority = ic.priority
	}
	fromKey := true
	var v string
	switch {
	case header == nil:
	case h.flowHeader != "":
		v = header.Get(h.flowHeader)
	case h.cfg.Flow == access.FlowUser:
		v = access.BodyUser(req.Body)
	}
	if v != "" {
		req.Flow, fromKey = access.FlowName(v), false
	}
	obs.get().Flow(req.Flow, access.PriorityName(req.Priority), fromKey)
	return nil
}
