package runsapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"iop/internal/edge/api/observe"
	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// BenchmarkRunTunnelStream20 measures a synchronous POST /v1/runs whose
// tunnel-path run records an answer of 20 SSE chunks (the frame's
// BenchmarkTunnelStream20's stream) in an in-memory runs store, through
// the API handler (ServeHTTP, in process), with an Observer and a ledger.
func BenchmarkRunTunnelStream20(b *testing.B) {
	const head = `data: {"id":"chatcmpl-sim-1","object":"chat.completion.chunk","created":1767225600,"model":"bench-openai","system_fingerprint":"fp_sim","choices":[`
	msgs := []*nodev1.RunUp{apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"})}
	size := 0
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
		size += len(ev)
		msgs = append(msgs, apitest.TunnelData(ev))
	}
	msgs = append(msgs, apitest.TunnelEnd())
	gw := &apitest.Gateway{Names: []string{"bench-openai"}, DispatchFunc: func(context.Context, contract.Request) (Run, error) {
		return apitest.ScriptedRun(tunnel, msgs...), nil
	}}
	cfg := api.Config{Observer: observe.ObserverFunc(func(observe.RequestRecord) {}), Ledger: &apitest.Ledger{}}
	cfg.APIs = []api.API{Routes(Config{Runs: newRunsManager(b)})}
	h := api.New(cfg, gw, slog.New(slog.DiscardHandler))
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for b.Loop() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/runs", strings.NewReader(`{"model":"bench-openai","prompt":"hi"}`))
		r.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK || !strings.Contains(w.Body.String(), `"state":"complete"`) {
			b.Fatalf("POST /v1/runs: %d %s", w.Code, w.Body)
		}
	}
}
