package api

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"iop/internal/edge/contract"
)

const (
	testTraceID    = "4bf92f3577b34da6a3ce929d0e0e4736"
	testParentSpan = "00f067aa0ba902b7"
)

// tracedEnv is a test API whose requests are traced into a span recorder
// (sampler decides), logging JSON into a buffer.
type tracedEnv struct {
	*testEnv
	spans *tracetest.SpanRecorder
	mu    sync.Mutex
	logs  bytes.Buffer
}

func newTracedEnv(t *testing.T, sampler sdktrace.Sampler, dispatch func(context.Context, contract.Request) (Run, error)) *tracedEnv {
	t.Helper()
	te := &tracedEnv{spans: tracetest.NewSpanRecorder()}
	cfg := Config{Now: time.Now}
	if sampler != nil {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSpanProcessor(te.spans))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		cfg.Tracer = tp.Tracer("test")
	}
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &te.logs, mu: &te.mu}, nil))
	te.testEnv = newEnvLogging(t, cfg, logger, dispatch)
	return te
}

// post posts body to the chat route, with traceparent if set.
func (te *tracedEnv) post(t *testing.T, body, traceparent string) rawResponse {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, te.srv.URL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-canary-key")
	if traceparent != "" {
		req.Header.Set("Traceparent", traceparent)
	}
	resp := te.do(t, req)
	te.waitHandlers()
	return resp
}

// requestLine is the request's log line.
func (te *tracedEnv) requestLine(t *testing.T) string {
	t.Helper()
	te.mu.Lock()
	defer te.mu.Unlock()
	for _, l := range strings.Split(te.logs.String(), "\n") {
		if strings.Contains(l, `"msg":"request"`) {
			return l
		}
	}
	t.Fatalf("no request line in %s", te.logs.String())
	return ""
}

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// A completed request's span continues the client's traceparent, is the
// server span "chat m", carries its context into Dispatch, has its events
// in order within it, GenAI and iop attributes, and names nothing of the
// client's key or prompt; its trace id is in the log line.
func TestTraceCompletedRequest(t *testing.T) {
	var dispatchCtx trace.SpanContext
	run := scriptedRun(normalized, events(started(), delta("Hello")), events(usageEvent(5, 2), complete("length")))
	te := newTracedEnv(t, sdktrace.ParentBased(sdktrace.AlwaysSample()), func(ctx context.Context, _ contract.Request) (Run, error) {
		dispatchCtx = trace.SpanContextFromContext(ctx)
		return run, nil
	})
	body := `{"model":"m","messages":[{"role":"user","content":"canary-prompt-text"}]}`
	if resp := te.post(t, body, "00-"+testTraceID+"-"+testParentSpan+"-01"); resp.status != 200 {
		t.Fatalf("status %d", resp.status)
	}
	ended := te.spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	s := ended[0]
	if s.Name() != "chat m" || s.SpanKind() != trace.SpanKindServer {
		t.Errorf("span %q kind %v, want server span %q", s.Name(), s.SpanKind(), "chat m")
	}
	if s.SpanContext().TraceID().String() != testTraceID || s.Parent().SpanID().String() != testParentSpan || !s.Parent().IsRemote() {
		t.Errorf("span trace %s parent %s, want the client's %s %s", s.SpanContext().TraceID(), s.Parent().SpanID(), testTraceID, testParentSpan)
	}
	if !dispatchCtx.Equal(s.SpanContext()) {
		t.Errorf("Dispatch's context carries %v, want the request span %v", dispatchCtx, s.SpanContext())
	}
	a := attrsOf(s)
	for k, want := range map[attribute.Key]string{"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
		"gen_ai.response.model": "served-model", "iop.node_id": "node1", "iop.provider_id": "prov1",
		"iop.execution_path": "normalized", "iop.queue_reason": "immediate", "iop.outcome": "completed", "iop.run_id": "run1"} {
		if got := a[k].AsString(); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if a["gen_ai.usage.input_tokens"].AsInt64() != 5 || a["gen_ai.usage.output_tokens"].AsInt64() != 2 {
		t.Errorf("usage %v %v, want 5 2", a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"])
	}
	if got := a["gen_ai.response.finish_reasons"].AsStringSlice(); len(got) != 1 || got[0] != "length" {
		t.Errorf("finish reasons %q, want [length]", got)
	}
	if s.Status().Code == codes.Error {
		t.Errorf("status %v", s.Status())
	}
	var names []string
	last := s.StartTime()
	for _, ev := range s.Events() {
		names = append(names, ev.Name)
		if ev.Time.Before(last) || ev.Time.After(s.EndTime()) {
			t.Errorf("event %s at %v out of order or outside [%v, %v]", ev.Name, ev.Time, s.StartTime(), s.EndTime())
		}
		last = ev.Time
	}
	// queued, admitted and dispatched are the edge service's (this
	// Gateway is a fake).
	if got := strings.Join(names, ","); got != "first_token,stream_end" {
		t.Errorf("events %s, want first_token,stream_end", got)
	}
	for _, kv := range s.Attributes() {
		if v := kv.Value.Emit(); strings.Contains(v, "canary") {
			t.Errorf("attribute %s = %q carries a secret", kv.Key, v)
		}
	}
	if line := te.requestLine(t); !strings.Contains(line, `"trace_id":"`+testTraceID+`"`) {
		t.Errorf("log line without the trace id: %s", line)
	}
}

// A refused request's span has status Error described by its outcome, and
// error.type its error code.
func TestTraceRefusedRequest(t *testing.T) {
	te := newTracedEnv(t, sdktrace.AlwaysSample(), failWith(fmt.Errorf("%w: 8 waiting", ErrQueueFull)))
	if resp := te.post(t, simpleChat, ""); resp.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.status)
	}
	ended := te.spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	s := ended[0]
	if s.Parent().IsValid() {
		t.Errorf("a request without traceparent has parent %v", s.Parent())
	}
	if s.Status().Code != codes.Error || s.Status().Description != "refused" {
		t.Errorf("status %v, want Error refused", s.Status())
	}
	a := attrsOf(s)
	if a["error.type"].AsString() != "queue_full" || a["iop.outcome"].AsString() != "refused" ||
		a["http.response.status_code"].AsInt64() != 429 || a["iop.queue_reason"].AsString() != "queue_full" {
		t.Errorf("attributes %v", s.Attributes())
	}
}

// Unsampled (the client's traceparent says so) or off: no trace id in the
// log line; off, Dispatch's context has no span, whatever the client sent.
func TestTraceIDOnlyWhenSampled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"unsampled", sdktrace.ParentBased(sdktrace.AlwaysSample())}, {"off", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			var dispatchCtx trace.SpanContext
			run := scriptedRun(normalized, events(started(), delta("Hello")), events(complete("stop")))
			te := newTracedEnv(t, tc.sampler, func(ctx context.Context, _ contract.Request) (Run, error) {
				dispatchCtx = trace.SpanContextFromContext(ctx)
				return run, nil
			})
			if resp := te.post(t, simpleChat, "00-"+testTraceID+"-"+testParentSpan+"-00"); resp.status != 200 {
				t.Fatalf("status %d", resp.status)
			}
			if line := te.requestLine(t); strings.Contains(line, "trace_id") {
				t.Errorf("log line has a trace id: %s", line)
			}
			if n := len(te.spans.Ended()); n != 0 {
				t.Errorf("%d spans recorded", n)
			}
			switch tc.name {
			case "off":
				if dispatchCtx.IsValid() {
					t.Errorf("tracing off, Dispatch got span context %v", dispatchCtx)
				}
			default:
				// Not sampled, but the context goes on (the node and the
				// provider keep the client's decision).
				if dispatchCtx.TraceID().String() != testTraceID || dispatchCtx.IsSampled() {
					t.Errorf("Dispatch got span context %v, want the client's trace, unsampled", dispatchCtx)
				}
			}
		})
	}
}
