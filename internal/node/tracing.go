package node

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"iop/internal/node/adapter"
	"iop/internal/tracing"
	"iop/internal/wire/nodev1"
)

// WithTracer makes the agent trace its runs with t (nil: no tracing, the
// default): a run span per run, the child of the edge's request span whose
// context the Dispatch carries (Dispatch.trace_context), and a client span
// per provider call, its child, whose context the adapters send to the
// provider as a traceparent header.
func WithTracer(t trace.Tracer) Option { return func(a *Agent) { a.tracer = t } }

// runSpans are the spans of one traced run. Only the run's goroutine
// (runOn) touches them.
type runSpans struct {
	run, call trace.Span
	// lastAt is when the run's terminal frame was sent (zero: not yet, or
	// never): both spans end no later, so that they end within the edge's
	// request span, which can end as soon as the edge has that frame.
	lastAt time.Time
	// status is a tunneled answer's HTTP status (0: none, or the
	// normalized path).
	status int
}

// endOptions ends a span now, or at lastAt if that was earlier.
func (s *runSpans) endOptions() []trace.SpanEndOption {
	if s.lastAt.IsZero() {
		return nil
	}
	return []trace.SpanEndOption{trace.WithTimestamp(s.lastAt)}
}

// pathName is the execution path as the edge's records name it.
func pathName(p nodev1.ExecutionPath) string {
	switch p {
	case nodev1.ExecutionPath_EXECUTION_PATH_TUNNEL:
		return "tunnel"
	case nodev1.ExecutionPath_EXECUTION_PATH_NORMALIZED:
		return "normalized"
	}
	return ""
}

// operationName is d's gen_ai.operation.name.
func operationName(op nodev1.Operation) string {
	switch op {
	case nodev1.Operation_OPERATION_CHAT:
		return tracing.OperationChat
	case nodev1.Operation_OPERATION_COMPLETION:
		return tracing.OperationTextCompletion
	case nodev1.Operation_OPERATION_EMBEDDINGS:
		return tracing.OperationEmbeddings
	}
	return ""
}

// startRunSpan starts the span of run d on provider p, continuing the trace
// context d carries, and returns ctx carrying it.
func (c *conn) startRunSpan(ctx context.Context, d *nodev1.Dispatch, p *provider) (context.Context, *runSpans) {
	ctx = tracing.Propagator.Extract(ctx, propagation.MapCarrier(d.TraceContext))
	ctx, span := c.a.tracer.Start(ctx, "run "+d.ServedModel, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			tracing.RunID.String(d.RunId),
			tracing.NodeID.String(c.a.cfg.NodeID),
			tracing.ProviderID.String(d.ProviderId),
			tracing.Generation.Int64(int64(c.gen)),
			tracing.ExecutionPath.String(pathName(p.path)),
			tracing.GenAIRequestModel.String(d.ServedModel),
			tracing.Stream.Bool(d.Stream),
		))
	return ctx, &runSpans{run: span}
}

// startCall starts the provider call's client span, named by the GenAI
// conventions "{gen_ai.operation.name} {gen_ai.request.model}", and returns
// ctx carrying it (the adapters send it on as traceparent).
func (s *runSpans) startCall(ctx context.Context, tracer trace.Tracer, d *nodev1.Dispatch, p *provider) context.Context {
	op := operationName(d.Operation)
	ctx, s.call = tracer.Start(ctx, op+" "+d.ServedModel, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			tracing.GenAIOperationName.String(op),
			tracing.GenAIRequestModel.String(d.ServedModel),
			tracing.GenAIProviderName.String(p.cfg.Type),
			tracing.ProviderID.String(d.ProviderId),
			tracing.ExecutionPath.String(pathName(p.path)),
		))
	return ctx
}

// errorType names how err ended a provider call (a sentinel's fixed text,
// never a message that may quote the provider).
func errorType(err error) string {
	for _, kind := range []error{adapter.ErrCancelled, adapter.ErrSink, adapter.ErrProviderTimeout,
		adapter.ErrProviderUnreachable, adapter.ErrProviderStatus, adapter.ErrProviderStream,
		adapter.ErrProviderReported, adapter.ErrProviderError, adapter.ErrBadRequest} {
		if errors.Is(err, kind) {
			return kind.Error()
		}
	}
	return "_OTHER"
}

// fail marks span failed by err.
func fail(span trace.Span, err error) {
	if err == nil {
		return
	}
	et := errorType(err)
	attrs := []attribute.KeyValue{tracing.ErrorType.String(et)}
	var ae *adapter.Error
	if errors.As(err, &ae) && ae.Status != 0 {
		attrs = append(attrs, tracing.HTTPResponseStatusCode.Int(ae.Status))
	}
	span.SetAttributes(attrs...)
	span.SetStatus(codes.Error, et)
}

// failStatus marks span failed by a relayed error answer: its status is
// at least min (400 for the provider call, a client span; 500 for the
// run, as for an HTTP server span), error.type the status.
func (s *runSpans) failStatus(span trace.Span, min int) {
	if s.status == 0 {
		return
	}
	span.SetAttributes(tracing.HTTPResponseStatusCode.Int(s.status))
	if s.status >= min {
		span.SetAttributes(tracing.ErrorType.String(strconv.Itoa(s.status)))
		span.SetStatus(codes.Error, "provider answered "+strconv.Itoa(s.status))
	}
}

// endCall ends the provider call's span with err, the adapter's result.
func (s *runSpans) endCall(err error) {
	if s.call == nil {
		return
	}
	if err != nil {
		fail(s.call, err)
	} else {
		s.failStatus(s.call, 400)
	}
	s.call.End(s.endOptions()...)
}

// end ends the run's span with err, the run's result.
func (s *runSpans) end(err error) {
	if err != nil {
		fail(s.run, err)
	} else {
		s.failStatus(s.run, 500)
	}
	s.run.End(s.endOptions()...)
}
