package edge

import (
	"net/http"
	"sync/atomic"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// runMsg is one message of a run from its node, decoded once, when it
// arrived (decodeRunUp): the typed message the caller of Recv gets, and
// what the edge itself reads of it (the release reason of a terminal
// message, what it says of the provider for the circuit breaker and the
// retry before the first byte).
type runMsg struct {
	msg contract.Message
	// reason is the release reason of a terminal message (msg.Ends).
	reason EndReason
	// verdict: what the message tells of its provider, whether it is the
	// first kind of message that tells it, and the retry reason (verdict).
	outcome  outcome
	decisive bool
	retry    string
	// late: the message ends an answer that began with a provider
	// failure (lateFailure).
	late bool
	// head is set for a TunnelHead; dataLen counts a TunnelData's bytes
	// (or those a TunnelHead carried).
	head    bool
	dataLen int
}

// decodes counts the run messages decodeRunUp decoded: a test hook, so a
// test can tell that each message is decoded once on its way to the
// client.
var decodes atomic.Int64

// decodeRunUp decodes m, ok false for a message that is not for the caller
// of Recv (a repeated RunOpen, an empty message). It is the one place
// where a run message is classified: terminal or not (and its release
// reason), its verdict for the breaker and the retry, its typed events.
func decodeRunUp(m *nodev1.RunUp) (runMsg, bool) {
	decodes.Add(1)
	reason, terminal, ok := classifyRunUp(m)
	if !ok {
		return runMsg{}, false
	}
	rm := runMsg{reason: reason, late: terminal && lateFailure(m)}
	rm.outcome, rm.decisive, rm.retry = verdict(m)
	rm.msg = decodeMessage(m)
	rm.msg.Ends = terminal
	switch msg := m.GetMsg().(type) {
	case *nodev1.RunUp_TunnelHead:
		rm.head = true
		rm.dataLen = len(msg.TunnelHead.GetData())
	case *nodev1.RunUp_TunnelData:
		rm.dataLen = len(msg.TunnelData.GetData())
	}
	return rm, true
}

// DecodeRunUp is m as the contract's typed message (contract.Message),
// with Ends set when m ends its run (a complete, error or cancelled event;
// TunnelEnd; TunnelError; a TunnelHead with end); ok is false for a message Run.Recv does not
// hand on (a repeated RunOpen, an empty message). The edge decodes each
// message once, when it arrives (decodeRunUp); this is exported so that
// tests of the HTTP API can feed their fake runs the node's messages.
func DecodeRunUp(m *nodev1.RunUp) (msg contract.Message, ok bool) {
	_, terminal, ok := classifyRunUp(m)
	if !ok {
		return contract.Message{}, false
	}
	msg = decodeMessage(m)
	msg.Ends = terminal
	return msg, true
}

// decodeMessage is m's typed message, without Ends.
func decodeMessage(m *nodev1.RunUp) contract.Message {
	var out contract.Message
	switch msg := m.GetMsg().(type) {
	case *nodev1.RunUp_Events:
		evs := msg.Events.GetEvents()
		for i, e := range evs {
			if ev, ok := decodeRunEvent(e); ok {
				if out.Events == nil {
					out.Events = make([]contract.Event, 0, len(evs)-i)
				}
				out.Events = append(out.Events, ev)
			}
		}
	case *nodev1.RunUp_TunnelHead:
		out.Tunnel = true
		h := msg.TunnelHead
		out.Part = contract.Event{Kind: contract.EventHead, Status: int(h.GetStatus()), Headers: h.GetHeaders(),
			Data: h.GetData(), End: h.GetEnd()}
		if !h.GetEnd() && h.GetContentLength() > 0 { // 0 is unknown (node.proto); with end the body is data
			out.Part.ContentLength = h.GetContentLength()
		}
	case *nodev1.RunUp_TunnelData:
		out.Tunnel = true
		out.Part = contract.Event{Kind: contract.EventData, Data: msg.TunnelData.GetData()}
	case *nodev1.RunUp_TunnelEnd:
		out.Tunnel = true
		out.Part = contract.Event{Kind: contract.EventEnd, ProviderError: msg.TunnelEnd.GetProviderError()}
	case *nodev1.RunUp_TunnelError:
		out.Tunnel = true
		te := msg.TunnelError
		// A TunnelError of status 400 is the node's own refusal of a
		// request it could not send (a tunnel relays the provider's error
		// answers as they are, never as a TunnelError).
		out.Part = contract.Event{Kind: contract.EventFailure, Status: int(te.GetStatus()), Message: te.GetMessage(),
			InvalidRequest: te.GetStatus() == http.StatusBadRequest}
	}
	return out
}

// decodeRunEvent is e as the contract's event; ok is false for an event
// only the edge reads (STARTED), one of a type it does not know, and a
// delta without content.
func decodeRunEvent(e *nodev1.RunEvent) (contract.Event, bool) {
	switch e.GetType() {
	case nodev1.RunEvent_TYPE_DELTA:
		if e.GetText() == "" && e.GetThinking() == "" && len(e.GetToolCalls()) == 0 && len(e.GetEmbeddings()) == 0 && len(e.GetLogprobs()) == 0 {
			return contract.Event{}, false
		}
		ev := contract.Event{Kind: contract.EventDelta, Text: e.GetText(), Thinking: e.GetThinking()}
		if tcs := e.GetToolCalls(); len(tcs) > 0 {
			ev.ToolCalls = make([]contract.ToolCallPart, len(tcs))
			for i, tc := range tcs {
				ev.ToolCalls[i] = contract.ToolCallPart{Index: int(tc.GetIndex()), ID: tc.GetId(), Name: tc.GetName(), Arguments: tc.GetArguments()}
			}
		}
		if lps := e.GetLogprobs(); len(lps) > 0 {
			ev.Logprobs = decodeLogprobs(lps)
		}
		if vecs := e.GetEmbeddings(); len(vecs) > 0 {
			ev.Embeddings = make([][]float32, len(vecs))
			for i, v := range vecs {
				ev.Embeddings[i] = v.GetValues()
			}
		}
		return ev, true
	case nodev1.RunEvent_TYPE_USAGE:
		return contract.Event{Kind: contract.EventUsage, PromptTokens: int(e.GetPromptTokens()), CompletionTokens: int(e.GetCompletionTokens())}, true
	case nodev1.RunEvent_TYPE_COMPLETE:
		return contract.Event{Kind: contract.EventEnd, FinishReason: e.GetFinishReason(), StopSequence: e.GetStopSequence()}, true
	case nodev1.RunEvent_TYPE_ERROR:
		return contract.Event{Kind: contract.EventFailure, Status: int(e.GetStatus()), Message: e.GetError(),
			InvalidRequest: e.GetInvalidRequest(), Param: e.GetParam()}, true
	case nodev1.RunEvent_TYPE_CANCELLED:
		return contract.Event{Kind: contract.EventFailure, Cancelled: true}, true
	default:
		return contract.Event{}, false
	}
}

// decodeLogprobs is a delta's log probabilities as the contract's.
func decodeLogprobs(lps []*nodev1.TokenLogprob) []contract.TokenLogprob {
	out := make([]contract.TokenLogprob, len(lps))
	for i, lp := range lps {
		out[i] = contract.TokenLogprob{Token: lp.GetToken(), Logprob: lp.GetLogprob(), Bytes: lp.GetBytes()}
		if top := lp.GetTopLogprobs(); len(top) > 0 {
			out[i].TopLogprobs = decodeLogprobs(top)
		}
	}
	return out
}
