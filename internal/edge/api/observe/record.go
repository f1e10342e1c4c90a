package observe

import (
	"time"

	"iop/internal/edge/contract"
)

// Observer is told of every finished API request, once, with its
// RequestRecord: the one hook metrics, request logs and later a usage
// ledger or a runs store share. RequestDone is called on the request's
// goroutine after the response ended (completed, failed or aborted); it
// must not block for long and must not keep rec's slices.
type Observer interface {
	RequestDone(rec RequestRecord)
}

// ObserverFunc makes a function an Observer.
type ObserverFunc func(RequestRecord)

// RequestDone calls f(rec).
func (f ObserverFunc) RequestDone(rec RequestRecord) { f(rec) }

// RequestRecord describes one finished API request. Durations are
// time.Duration (nanoseconds); zero means "did not happen" or "not known".
type RequestRecord struct {
	// API names the route's operation: "chat.completions".
	API string
	// RequestID names the request: "req_" and 32 hex digits, new for each
	// request the edge serves (the answer's X-Request-Id, or Request-Id
	// on the Anthropic routes; the log line's request_id, the usage
	// ledger's, the trace's iop.request_id). A client's own X-Request-Id
	// never replaces it (ClientRequestID).
	RequestID string
	// ClientRequestID is the X-Request-Id header the client sent, clipped
	// to 256 bytes; "" for none. It is relayed to the provider as it is and
	// logged (client_request_id), and names nothing else.
	ClientRequestID string
	// Key is the name of the request's API key; "" on an open API.
	Key string
	// Model is the model name the request asked for (clipped to 256
	// bytes); "" when the body was not decoded. It is a client's string:
	// only when Admission is neither "", unknown_model nor cancelled is it
	// known to be a configured alias or served model.
	Model  string
	Stream bool
	// Where the run went (zero when it was not dispatched).
	RunID, NodeID, ProviderID, ProviderType, ServedModel string
	Generation                                           uint64
	// Path is "tunnel" or "normalized"; "" when not dispatched.
	Path string
	// Admission is one of the Admission* values; "" when the request never
	// reached admission (refused as invalid).
	Admission contract.Admission
	// QueueWait is the time spent queued for a slot.
	QueueWait time.Duration
	// Flow is the request's flow in its model's queue and Priority its
	// band ("critical", "standard", "sheddable"); both "" when the request
	// never reached admission. FlowFromKey says the flow is its key's name
	// (a configured, bounded set) rather than a client's header or user
	// value. ShedReason is "displaced" or "expected_wait" when Admission
	// is shed.
	Flow, Priority, ShedReason string
	FlowFromKey                bool
	// Status is the HTTP status sent; 0 when nothing was (the connection
	// was aborted first). A stream that failed after it started keeps 200.
	Status int
	// Outcome is one of the Outcome* values, decided once when the request
	// ended (Request.Decide); the log line, the metrics, the usage
	// ledger, the run's RunEnded event and a runs API record all carry it.
	Outcome contract.Outcome
	// ErrorCode is the OpenAI error code answered ("queue_full", ...), if any.
	ErrorCode string
	// Start is when the request reached the handler; Duration from then to
	// the end of the response.
	Start    time.Time
	Duration time.Duration
	// SlotTime is from when the request's lease was granted (its first
	// dispatch's start plus its queue wait) to the end of the response:
	// how long it held a provider slot; 0 when not dispatched.
	SlotTime time.Duration
	// CostWeight is the provider's cost_weight (0: 1; not dispatched).
	CostWeight float64
	// TimeToFirstToken is from Start to the first generated text reaching
	// the edge (a non-empty delta; on the tunnel path an SSE event carrying
	// content); 0 when none did or it cannot be seen (a tunnel JSON body).
	TimeToFirstToken time.Duration
	// InterTokenLatency is the mean time between output tokens, from the
	// first to the last, when at least two were seen.
	InterTokenLatency time.Duration
	// InputTokens and OutputTokens are the run's usage when TokensKnown: the
	// node's usage event (normalized path), or the usage object in the
	// provider's answer (tunnel path; a stream carries it only when the
	// client asked for stream_options.include_usage).
	InputTokens, OutputTokens int
	TokensKnown               bool
	// TraceID is the request's trace id (32 hex digits) when its trace is
	// sampled (the frame's tracer); "" otherwise. The log line's trace_id and
	// the latency histograms' exemplars carry it.
	TraceID string
}
