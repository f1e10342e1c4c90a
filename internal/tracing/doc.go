// Package tracing sets up OpenTelemetry tracing for an iop process (edge or
// node) from its config file's `tracing:` section and the standard
// OTEL_* environment variables (Config, Start), and names the attributes
// and span events iop's spans carry (attrs.go).
//
// Off by default: without an endpoint, Start returns a Tracing whose
// Tracer is nil, and every caller skips its tracing work on that nil, so
// tracing off costs a nil test per request.
//
// One trace per request: the edge continues a client's W3C traceparent
// (else starts a trace) with a server span; the trace context crosses the
// node link in the Dispatch message (node.proto Dispatch.trace_context,
// read and written with propagation.MapCarrier); the node's run span is
// its child, and the provider call (a client span, child of the run)
// sends it on as a traceparent header.
//
// Concurrency: a Tracing is safe for concurrent use (the SDK's tracer);
// Start and Shutdown are called once each by the process.
package tracing
