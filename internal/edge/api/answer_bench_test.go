package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
)

// simAnswer is a non-streamed chat completion as iop sim answers one (8
// tokens).
const simAnswer = `{"id":"chatcmpl-sim-1","object":"chat.completion","created":1767225600,"model":"bench-openai","system_fingerprint":"fp_sim",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Lorem ipsum dolor sit amet consectetur adipiscing elit"},"logprobs":null,"finish_reason":"length"}],` +
	`"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}`

// nodeAnswer is simAnswer as a node sends it: one message, its head with
// the whole body and end (node.proto TunnelHead.data, end).
func nodeAnswer() []*contract.Message {
	return []*contract.Message{decoded(wholeAnswer(200, map[string]string{"Content-Type": "application/json"}, simAnswer))}
}

// BenchmarkTunnelAnswer measures one non-streamed tunnel-path answer, as
// the node sends it (nodeAnswer), through the API handler (ServeHTTP, in
// process) per answer: chat, a POST /v1/chat/completions relayed to the
// client with its observation (an Observer and a ledger record it);
// relay, the tunnel relay alone (Answer.tunnel with its observation).
func BenchmarkTunnelAnswer(b *testing.B) {
	msgs := nodeAnswer()
	gw := &fakeGateway{models: []string{"bench-openai"}, dispatch: func(context.Context, contract.Request) (Run, error) {
		return &listRun{msgs: msgs}, nil
	}}
	logger := slog.New(slog.DiscardHandler)
	cfg := Config{Observer: observe.ObserverFunc(func(observe.RequestRecord) {}), Ledger: &recordingLedger{}}
	b.Run("chat", func(b *testing.B) {
		h := New(withOpenAI(cfg), gw, logger)
		req := `{"model":"bench-openai","messages":[{"role":"user","content":"hi"}]}`
		b.ReportAllocs()
		b.SetBytes(int64(len(simAnswer)))
		cpu := cpuTime()
		for b.Loop() {
			resetBench(gw, cfg.Ledger.(*recordingLedger))
			w := &discardWriter{header: http.Header{}}
			h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(req)))
			if w.n != int64(len(simAnswer)) {
				b.Fatalf("relayed %d bytes, want %d", w.n, len(simAnswer))
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
	})
	b.Run("relay", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(simAnswer)))
		cpu := cpuTime()
		for b.Loop() {
			rr, w := benchResponse(&listRun{msgs: msgs})
			rr.obs = &observation{}
			if reason := rr.tunnel(); reason != ReasonCompleted || w.n != int64(len(simAnswer)) {
				b.Fatalf("tunnel ended %q after %d bytes", reason, w.n)
			}
		}
		b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "cpu-ns/op")
	})
}

// cpuTime is the CPU time the process used so far, user and system, every
// goroutine's: on a loaded machine a steadier figure than the wall time
// per op.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
