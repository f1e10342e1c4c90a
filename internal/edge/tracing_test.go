package edge

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// A traced request (a span in Dispatch's context) gets the span events
// queued, admitted (with its queue reason) and dispatched (with its run,
// node and provider), in that order, and its Dispatch carries the span's
// W3C trace context (trace_context); an untraced one carries none.
func TestDispatchTracesTheRequestSpan(t *testing.T) {
	e := startEdge(t, testConfig())
	n := e.connect(t, hello("n1", prov("p1", tunnel, 1, "m-big")))
	e.waitUntil(t, "p1 registered", func(s contract.Snapshot) bool { return len(s.Providers) == 1 })

	// Untraced: the one slot is taken, with no trace context.
	first, _, d0 := e.startRun(t, n, chatReq("chat"))
	if len(d0.GetTraceContext()) != 0 {
		t.Errorf("an untraced request's Dispatch has trace context %v", d0.GetTraceContext())
	}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	res := e.dispatchAsync(ctx, chatReq("chat"))
	waitFor(t, func() bool { return e.svc.Snapshot().Waiters == 1 })
	first.Close("test: free the slot")
	// The first run's Cancel and the second's Dispatch come in either order.
	var d *nodev1.Dispatch
	for d == nil {
		m := n.next(t)
		if m.GetCancel() == nil && m.GetDispatch() == nil {
			t.Fatalf("got %v, want the first run's Cancel or the second's Dispatch", m)
		}
		d = m.GetDispatch()
	}
	e.readBody(t, d, n.openRun(t, d.GetRunId(), n.gen))
	if got := wait(t, res); got.err != nil {
		t.Fatalf("Dispatch: %v", got.err)
	} else {
		defer got.run.Close("test cleanup")
	}
	span.End()

	sc := span.SpanContext()
	if got, want := d.GetTraceContext()["traceparent"], "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01"; got != want {
		t.Errorf("Dispatch traceparent %q, want %q", got, want)
	}
	ended := rec.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended", len(ended))
	}
	var names []string
	attrs := map[string]map[attribute.Key]string{}
	for _, ev := range ended[0].Events() {
		names = append(names, ev.Name)
		attrs[ev.Name] = map[attribute.Key]string{}
		for _, kv := range ev.Attributes {
			attrs[ev.Name][kv.Key] = kv.Value.Emit()
		}
	}
	if len(names) != 3 || names[0] != "queued" || names[1] != "admitted" || names[2] != "dispatched" {
		t.Fatalf("events %q, want queued, admitted, dispatched", names)
	}
	if attrs["admitted"]["iop.queue_reason"] != "queued" || attrs["admitted"]["iop.queue_wait"] == "" {
		t.Errorf("admitted attributes %v", attrs["admitted"])
	}
	if got := attrs["dispatched"]; got["iop.run_id"] != d.GetRunId() || got["iop.node_id"] != "n1" || got["iop.provider_id"] != "p1" {
		t.Errorf("dispatched attributes %v, want run %s on n1/p1", got, d.GetRunId())
	}
}
