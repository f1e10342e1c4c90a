package api

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// listRun is a Run that yields msgs (decoded once, as the edge does on
// arrival), then io.EOF.
type listRun struct {
	msgs []*contract.Message
	i    int
}

func (r *listRun) Info() contract.DispatchInfo {
	return contract.DispatchInfo{RunID: "run_0123456789abcdef", NodeID: "n", ProviderID: "p", Path: contract.PathTunnel}
}
func (r *listRun) Close(contract.Outcome) {}
func (r *listRun) Cancel(string)          {}
func (r *listRun) Fail(string)            {}
func (r *listRun) Recv() (contract.Message, error) {
	if r.i == len(r.msgs) {
		return contract.Message{}, io.EOF
	}
	r.i++
	return *r.msgs[r.i-1], nil
}

// tunnelStream20 is a tunnel answer of 20 TunnelData messages, as vLLM or
// iop sim streams a chat completion with include_usage: 18 one-token
// chunks, the finish chunk, and the usage chunk with [DONE].
func tunnelStream20() (msgs []*contract.Message, body string) {
	msgs = append(msgs, decoded(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelHead{TunnelHead: &nodev1.TunnelHead{
		Status: 200, Headers: map[string]string{"Content-Type": "text/event-stream"}}}}))
	const head = `data: {"id":"chatcmpl-sim-1","object":"chat.completion.chunk","created":1767225600,"model":"bench-openai","system_fingerprint":"fp_sim","choices":[`
	var b strings.Builder
	for i := range 20 {
		var ev string
		switch i {
		case 18:
			ev = head + `{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n"
		case 19:
			ev = head[:len(head)-len(`"choices":[`)] + `"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":18,"total_tokens":30}}` + "\n\ndata: [DONE]\n\n"
		default:
			ev = head + fmt.Sprintf(`{"index":0,"delta":{"content":" token%d"},"finish_reason":null}]}`, i) + "\n\n"
		}
		b.WriteString(ev)
		msgs = append(msgs, decoded(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelData{TunnelData: &nodev1.TunnelData{Data: []byte(ev)}}}))
	}
	msgs = append(msgs, decoded(&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}}))
	return msgs, b.String()
}

// BenchmarkTunnelStream20 measures one tunnel-path answer of 20 SSE
// chunks through the API handler (ServeHTTP, in process), per answer:
// chat, a streaming POST /v1/chat/completions relayed to the client with
// its observation (content, usage; an Observer and a ledger record it);
// relay, the tunnel relay of chat alone (Answer.tunnel with its
// observation). Package runsapi's BenchmarkRunTunnelStream20 records
// the same stream in a run.
func BenchmarkTunnelStream20(b *testing.B) {
	msgs, body := tunnelStream20()
	gw := &fakeGateway{models: []string{"bench-openai"}, dispatch: func(context.Context, contract.Request) (Run, error) {
		return &listRun{msgs: msgs}, nil
	}}
	logger := slog.New(slog.DiscardHandler)
	cfg := Config{Observer: observe.ObserverFunc(func(observe.RequestRecord) {}), Ledger: &recordingLedger{}}
	b.Run("chat", func(b *testing.B) {
		h := New(cfg, gw, logger)
		req := `{"model":"bench-openai","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			resetBench(gw, cfg.Ledger.(*recordingLedger))
			w := &discardWriter{header: http.Header{}}
			h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(req)))
			if w.n != int64(len(body)) {
				b.Fatalf("relayed %d bytes, want %d", w.n, len(body))
			}
		}
	})
	b.Run("relay", func(b *testing.B) {
		// The tunnel relay alone (Answer.tunnel with its observation),
		// without the request's decode, dispatch and record.
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			rr, w := benchResponse(&listRun{msgs: msgs})
			rr.obs = &observation{}
			if reason := rr.tunnel(); reason != ReasonCompleted || w.n != int64(len(body)) {
				b.Fatalf("tunnel ended %q after %d bytes", reason, w.n)
			}
		}
	})
}

// resetBench forgets what the gateway and the ledger kept of the
// benchmark's earlier answers.
func resetBench(gw *fakeGateway, l *recordingLedger) {
	gw.mu.Lock()
	gw.reqs, gw.runs = gw.reqs[:0], gw.runs[:0]
	gw.mu.Unlock()
	l.mu.Lock()
	l.entries = l.entries[:0]
	l.mu.Unlock()
}
