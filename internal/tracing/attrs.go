package tracing

import (
	"go.opentelemetry.io/otel/attribute"
)

// Attribute keys of iop's spans: the OpenTelemetry GenAI semantic
// conventions (semconv v1.37+, where gen_ai.provider.name replaced
// gen_ai.system), HTTP basics, and iop's own. Values are ids, names,
// counts and outcomes: never a prompt, an answer, a header value or a key.
const (
	GenAIOperationName         = attribute.Key("gen_ai.operation.name")
	GenAIRequestModel          = attribute.Key("gen_ai.request.model")
	GenAIResponseModel         = attribute.Key("gen_ai.response.model")
	GenAIProviderName          = attribute.Key("gen_ai.provider.name")
	GenAIUsageInputTokens      = attribute.Key("gen_ai.usage.input_tokens")
	GenAIUsageOutputTokens     = attribute.Key("gen_ai.usage.output_tokens")
	GenAIResponseFinishReasons = attribute.Key("gen_ai.response.finish_reasons")

	HTTPRequestMethod      = attribute.Key("http.request.method")
	HTTPRoute              = attribute.Key("http.route")
	HTTPResponseStatusCode = attribute.Key("http.response.status_code")
	ErrorType              = attribute.Key("error.type")

	NodeID        = attribute.Key("iop.node_id")
	ProviderID    = attribute.Key("iop.provider_id")
	Generation    = attribute.Key("iop.generation")
	ExecutionPath = attribute.Key("iop.execution_path")
	QueueReason   = attribute.Key("iop.queue_reason")
	// QueueWait is the time queued for a slot, in seconds.
	QueueWait = attribute.Key("iop.queue_wait")
	RunID     = attribute.Key("iop.run_id")
	RequestID = attribute.Key("iop.request_id")
	Outcome   = attribute.Key("iop.outcome")
	Stream    = attribute.Key("iop.stream")
	// Reason is how a run's rendering (stream_end) or a run (node) ended.
	Reason = attribute.Key("iop.reason")
)

// Span event names of the edge's request span, in the order they happen.
const (
	EventQueued     = "queued"      // the request waits in its model's queue
	EventAdmitted   = "admitted"    // it got a provider slot (iop.queue_reason, iop.queue_wait)
	EventDispatched = "dispatched"  // its run was sent to the node (iop.run_id, iop.node_id, iop.provider_id)
	EventFirstToken = "first_token" // the first generated text reached the edge
	EventStreamEnd  = "stream_end"  // the run's answer ended (iop.reason)
)

// Operation names of gen_ai.operation.name.
const (
	OperationChat           = "chat"
	OperationTextCompletion = "text_completion"
	OperationEmbeddings     = "embeddings"
)
