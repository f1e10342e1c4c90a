package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
)

// discardSpans is a span processor that drops every span: the cost of
// making spans, without an exporter's.
type discardSpans struct{}

func (discardSpans) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discardSpans) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discardSpans) Shutdown(context.Context) error                  { return nil }
func (discardSpans) ForceFlush(context.Context) error                { return nil }

// BenchmarkTracedTunnelStream20 is BenchmarkTunnelStream20's chat (a
// streaming POST /v1/chat/completions of 20 SSE chunks through ServeHTTP)
// with tracing: off (Config.Tracer nil, the default), sampled (every
// request's span recorded, then dropped: the SDK's cost without an
// exporter's) and unsampled (the SDK with a never sampler).
func BenchmarkTracedTunnelStream20(b *testing.B) {
	msgs, body := tunnelStream20()
	gw := &fakeGateway{models: []string{"bench-openai"}, dispatch: func(context.Context, contract.Request) (Run, error) {
		return &listRun{msgs: msgs}, nil
	}}
	logger := slog.New(slog.DiscardHandler)
	for _, bc := range []struct {
		name    string
		sampler sdktrace.Sampler
	}{{"off", nil}, {"sampled", sdktrace.AlwaysSample()}, {"unsampled", sdktrace.NeverSample()}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := Config{Observer: observe.ObserverFunc(func(observe.RequestRecord) {}), Ledger: &recordingLedger{}}
			if bc.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(bc.sampler), sdktrace.WithSpanProcessor(discardSpans{}))
				defer tp.Shutdown(context.Background())
				cfg.Tracer = tp.Tracer("bench")
			}
			h := New(cfg, gw, logger)
			req := `{"model":"bench-openai","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			cpu := cpuTime()
			for b.Loop() {
				resetBench(gw, cfg.Ledger.(*recordingLedger))
				w := &discardWriter{header: http.Header{}}
				h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(req)))
				if w.n != int64(len(body)) {
					b.Fatalf("relayed %d bytes, want %d", w.n, len(body))
				}
			}
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
