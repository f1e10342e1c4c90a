package access

import (
	"encoding/json"
	"net/http"
	"strings"
	"unicode/utf8"

	"iop/internal/edge/contract"
)

// PriorityHeader asks for a request's priority band (docs/scheduling.md, "Fair
// sharing"), where its key's priority_header allows it.
const PriorityHeader = "X-Iop-Priority"

// Flow sources of api.Config.Flow: the key's name, the OpenAI body's
// "user", or a header's value (FlowHeaderPrefix and the header's name).
const (
	FlowKey          = "key"
	FlowUser         = "user"
	FlowHeaderPrefix = "header:"
)

// maxFlowBytes bounds a flow name taken from a client's header or body: a
// longer value is cut to its first maxFlowBytes bytes.
const maxFlowBytes = 64

// FlowName is a client-given flow value as a flow name: valid UTF-8 (each
// invalid byte sequence replaced by U+FFFD) and at most 64 bytes, cut
// at a character boundary. The name is a Prometheus label value and a log
// field, and client_golang panics on a label that is not UTF-8
// (TestRegression_FlowNameCutInsideACharacter).
func FlowName(v string) string {
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

// BodyUser is the OpenAI body's "user" field (chat, completions,
// embeddings, responses: "a unique identifier representing your end-user"),
// "" when there is none or it is no string.
func BodyUser(body []byte) string {
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

// PriorityName is the name of a priority rank (contract.Priority*):
// "critical", "standard", "sheddable" or "batch".
func PriorityName(rank int) string {
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

// FlowHeader is the canonical header name of a "header:<Name>" flow
// source, "" for any other.
func FlowHeader(source string) string {
	name, ok := strings.CutPrefix(source, FlowHeaderPrefix)
	if !ok {
		return ""
	}
	return http.CanonicalHeaderKey(name)
}
