package observe

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"iop/internal/edge/contract"
	"iop/internal/tracing"
)

// span is the trace of one API request (a tracer set): a
// server span that continues the client's W3C traceparent (else starts a
// trace), named by the GenAI conventions "{gen_ai.operation.name}
// {gen_ai.request.model}" once the body is decoded, with the span events
// of package tracing (queued, admitted and dispatched are added by the
// edge service on the span Dispatch's context carries, first_token and
// stream_end here). Its attributes are ids, names, counts and outcomes:
// never a header value, a body, a prompt or an answer. Only the request's
// goroutine touches it, as its observation.
type span struct {
	tracer        trace.Tracer
	parent        context.Context // the client's trace context, if it sent one
	method, route string
	span          trace.Span // nil until begin
}

// newSpan prepares the span of r, of the route at path route ("": none).
func newSpan(tracer trace.Tracer, r *http.Request, route string) *span {
	rs := &span{tracer: tracer, method: r.Method, route: route}
	rs.parent = tracing.Propagator.Extract(context.Background(), propagation.HeaderCarrier(r.Header))
	return rs
}

// begin starts the span of an API request of operation api that reached
// the handler at start.
func (rs *span) begin(api string, start time.Time) {
	attrs := make([]attribute.KeyValue, 0, 2)
	attrs = append(attrs, tracing.HTTPRequestMethod.String(rs.method))
	if rs.route != "" {
		attrs = append(attrs, tracing.HTTPRoute.String(rs.route))
	}
	_, rs.span = rs.tracer.Start(rs.parent, api, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(start), trace.WithAttributes(attrs...))
}

// genAIOperation is gen_ai.operation.name for op ("" when it has none).
func genAIOperation(op contract.Operation) string {
	switch op {
	case contract.OperationChat:
		return tracing.OperationChat
	case contract.OperationCompletion:
		return tracing.OperationTextCompletion
	case contract.OperationEmbeddings:
		return tracing.OperationEmbeddings
	}
	return ""
}

// request names the span by the decoded request.
func (rs *span) request(op contract.Operation, model string) {
	if rs.span == nil || !rs.span.IsRecording() {
		return
	}
	name := genAIOperation(op)
	if name == "" {
		return
	}
	rs.span.SetAttributes(tracing.GenAIOperationName.String(name), tracing.GenAIRequestModel.String(model))
	if model != "" {
		name += " " + model
	}
	rs.span.SetName(name)
}

// event adds the span event name at t.
func (rs *span) event(name string, t time.Time, attrs ...attribute.KeyValue) {
	if rs.span != nil && rs.span.IsRecording() {
		rs.span.AddEvent(name, trace.WithTimestamp(t), trace.WithAttributes(attrs...))
	}
}

// context returns ctx carrying the span, for Dispatch (its events, and the
// trace context it sends to the node).
func (rs *span) context(ctx context.Context) context.Context {
	if rs.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, rs.span)
}

// drop ends the span of a request another records (Request.HandOff).
func (rs *span) drop() {
	if rs.span != nil {
		rs.span.End()
	}
}

// end completes the span from the request's record and ends it at the end
// of the response; it returns the trace id when the trace is sampled, else
// "". finish is the normalized run's finish reason, if known. A request
// that did not complete has status Error, described by its outcome, and
// error.type its error code (else its outcome).
func (rs *span) end(rec *RequestRecord, finish string) string {
	if rs.span == nil {
		return ""
	}
	defer rs.span.End(trace.WithTimestamp(rec.Start.Add(rec.Duration)))
	if !rs.span.IsRecording() {
		return ""
	}
	attrs := make([]attribute.KeyValue, 0, 16)
	attrs = append(attrs, tracing.RequestID.String(rec.RequestID), tracing.Outcome.String(rec.Outcome.String()),
		tracing.Stream.Bool(rec.Stream))
	if rec.Status != 0 {
		attrs = append(attrs, tracing.HTTPResponseStatusCode.Int(rec.Status))
	}
	if rec.Admission != "" {
		attrs = append(attrs, tracing.QueueReason.String(rec.Admission.String()), tracing.QueueWait.Float64(rec.QueueWait.Seconds()))
	}
	if rec.RunID != "" {
		attrs = append(attrs, tracing.RunID.String(rec.RunID), tracing.NodeID.String(rec.NodeID),
			tracing.ProviderID.String(rec.ProviderID), tracing.Generation.Int64(int64(rec.Generation)),
			tracing.ExecutionPath.String(rec.Path), tracing.GenAIResponseModel.String(rec.ServedModel))
		if rec.ProviderType != "" {
			attrs = append(attrs, tracing.GenAIProviderName.String(rec.ProviderType))
		}
	}
	if rec.TokensKnown {
		attrs = append(attrs, tracing.GenAIUsageInputTokens.Int(rec.InputTokens), tracing.GenAIUsageOutputTokens.Int(rec.OutputTokens))
	}
	if finish != "" {
		attrs = append(attrs, tracing.GenAIResponseFinishReasons.StringSlice([]string{finish}))
	}
	if rec.Outcome != contract.OutcomeCompleted {
		errType := rec.ErrorCode
		if errType == "" {
			errType = rec.Outcome.String()
		}
		attrs = append(attrs, tracing.ErrorType.String(errType))
		rs.span.SetStatus(codes.Error, rec.Outcome.String())
	}
	rs.span.SetAttributes(attrs...)
	if sc := rs.span.SpanContext(); sc.IsSampled() {
		return sc.TraceID().String()
	}
	return ""
}
