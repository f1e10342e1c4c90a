package api

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"unicode/utf8"

	"iop/internal/auth"
	"iop/internal/edge/contract"
)

// PriorityHeader asks for a request's priority band (docs/scheduling.md, "Fair
// sharing"), where its key's priority_header allows it.
const PriorityHeader = "X-Iop-Priority"

// Flow sources of Config.Flow.
const (
	FlowKey          = "key"
	FlowUser         = "user"
	FlowHeaderPrefix = "header:"
)

// maxFlowBytes bounds a flow name taken from a client's header or body: a
// longer value is cut to its first maxFlowBytes bytes.
const maxFlowBytes = 64

var errBadPriority = &requestError{param: PriorityHeader, message: "must be one of critical, standard, sheddable"}

// assignFlow sets req's flow, weight and priority before its dispatch:
// the flow is the key's name, or the value of the header or body field
// Config.Flow names where the request has one (cut to maxFlowBytes); the
// weight is the key's; the priority the key's, or the header's where the
// key allows it (auth.Caller.Priority). An open API's requests are of the
// default flow "" with weight 1 and standard priority, unless the flow
// source names them. header is nil for a run of the runs API (no client
// headers): its flow is its key's. It returns errBadPriority (400) for a
// priority header the key allows that names no priority.
func (h *handler) assignFlow(ctx context.Context, header http.Header, req *contract.Request, obs *observation) error {
	req.Weight, req.Priority = 1, contract.PriorityStandard
	if c := auth.FromContext(ctx); c != nil {
		rank, ok := c.Priority(header.Get(PriorityHeader))
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
	case h.cfg.Flow == FlowUser:
		v = bodyUser(req.Body)
	}
	if v != "" {
		req.Flow, fromKey = flowName(v), false
	}
	obs.get().Flow(req.Flow, priorityName(req.Priority), fromKey)
	return nil
}

// flowName is a client-given flow value as a flow name: valid UTF-8 (each
// invalid byte sequence replaced by U+FFFD) and at most maxFlowBytes, cut
// at a character boundary. The name is a Prometheus label value and a log
// field, and client_golang panics on a label that is not UTF-8
// (TestRegression_FlowNameCutInsideACharacter).
func flowName(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD")
	if len(v) <= maxFlowBytes {
		return v
	}
	cut := maxFlowBytes
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut]
}

// bodyUser is the OpenAI body's "user" field (chat, completions,
// embeddings, responses: "a unique identifier representing your end-user"),
// "" when there is none or it is no string.
func bodyUser(body []byte) string {
	var b struct {
		User json.RawMessage `json:"user"`
	}
	if json.Unmarshal(body, &b) != nil || len(b.User) == 0 || b.User[0] != '"' {
		return ""
	}
	var s string
	if json.Unmarshal(b.User, &s) != nil {
		return ""
	}
	return s
}

func priorityName(rank int) string {
	switch rank {
	case contract.PriorityCritical:
		return "critical"
	case contract.PrioritySheddable:
		return "sheddable"
	case contract.PriorityBatch:
		return "batch"
	}
	return "standard"
}

// flowHeaderOf is the canonical header name of a "header:<Name>" flow
// source, "" for any other.
func flowHeaderOf(source string) string {
	name, ok := strings.CutPrefix(source, FlowHeaderPrefix)
	if !ok {
		return ""
	}
	return http.CanonicalHeaderKey(name)
}
