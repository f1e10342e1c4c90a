package node

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"iop/internal/wire/nodev1"
)

// A traced run whose provider answers 500: the run span (server, the child
// of the Dispatch's trace context) and the provider call (client, the
// run's child, whose traceparent the provider got) both end with status
// Error and the failure's kind, on both execution paths.
func TestRunSpansOfAFailedProviderCall(t *testing.T) {
	const traceID, parentSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, path := range []nodev1.ExecutionPath{tunnel, normalized} {
		t.Run(path.String(), func(t *testing.T) {
			e, addr := startEdge(t)
			seen := make(chan string, 1)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				seen <- r.Header.Get("Traceparent")
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusInternalServerError)
				io.WriteString(w, `{"error":{"message":"boom"}}`)
			}))
			t.Cleanup(up.Close)
			pc := ProviderConfig{ID: "p", Type: "vllm", BaseURL: up.URL + "/v1", Models: []string{"served-model"}}
			if path == normalized {
				pc = ProviderConfig{ID: "p", Type: "ollama", BaseURL: up.URL, Models: []string{"served-model"}}
			}
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			startAgentWith(t, testConfig(addr, pc), newTestClock(), nil, func(a *Agent) { a.tracer = tp.Tracer("test") })
			c := connect(t, e, 1, hour)
			m := inlineDispatchMsg("r1", "p", path, `{"model":"alias","messages":[{"role":"user","content":"hi"}],"stream":true}`)
			m.GetDispatch().TraceContext = map[string]string{"traceparent": "00-" + traceID + "-" + parentSpan + "-01"}
			c.send(t, m)
			r := recv(t, e.runs, "run stream")
			got := recv(t, seen, "provider request")
			r.rest(t)
			// The run's spans end just after its last frame went up.
			deadline := time.After(failsafe)
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for len(rec.Ended()) < 2 {
				select {
				case <-tick.C:
				case <-deadline:
					t.Fatalf("%d spans ended, want 2", len(rec.Ended()))
				}
			}
			var run, call sdktrace.ReadOnlySpan
			for _, s := range rec.Ended() {
				switch s.SpanKind() {
				case trace.SpanKindServer:
					run = s
				case trace.SpanKindClient:
					call = s
				}
			}
			if run == nil || call == nil {
				t.Fatalf("spans %v, want a server and a client span", rec.Ended())
			}
			if run.SpanContext().TraceID().String() != traceID || run.Parent().SpanID().String() != parentSpan {
				t.Errorf("run span in trace %s under %s, want %s under %s", run.SpanContext().TraceID(), run.Parent().SpanID(), traceID, parentSpan)
			}
			if call.Parent().SpanID() != run.SpanContext().SpanID() {
				t.Errorf("provider call's parent %s, want the run %s", call.Parent().SpanID(), run.SpanContext().SpanID())
			}
			if want := "00-" + traceID + "-" + call.SpanContext().SpanID().String() + "-01"; got != want {
				t.Errorf("provider got traceparent %q, want %q", got, want)
			}
			for _, s := range []sdktrace.ReadOnlySpan{run, call} {
				attrs := map[attribute.Key]attribute.Value{}
				for _, kv := range s.Attributes() {
					attrs[kv.Key] = kv.Value
				}
				// The tunnel relays the provider's error answer (its status
				// is the error); the normalized path fails the call.
				wantType := "provider answered with an error status"
				if path == tunnel {
					wantType = "500"
				}
				if s.Status().Code != codes.Error || attrs["error.type"].AsString() != wantType || attrs["http.response.status_code"].AsInt64() != 500 {
					t.Errorf("%s: status %v, error.type %q, http.response.status_code %v", s.Name(), s.Status(), attrs["error.type"].AsString(), attrs["http.response.status_code"])
				}
				if s.StartTime().After(s.EndTime()) {
					t.Errorf("%s ends before it starts", s.Name())
				}
			}
			if call.Name() != "chat served-model" || run.Name() != "run served-model" {
				t.Errorf("spans %q and %q", run.Name(), call.Name())
			}
			if call.StartTime().Before(run.StartTime()) || call.EndTime().After(run.EndTime()) {
				t.Errorf("provider call [%v, %v] outside its run [%v, %v]", call.StartTime(), call.EndTime(), run.StartTime(), run.EndTime())
			}
		})
	}
}
