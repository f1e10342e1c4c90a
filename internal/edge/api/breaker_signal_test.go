package api

import (
	"strings"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/wire/nodev1"
)

// TestRegression_BrokenTunnelAnswerFailsTheRun: the translated routes
// (Ollama; Messages and Responses in their packages) stop reading a tunnel at the provider's
// error object inside its 200 stream, before the TunnelEnd whose
// provider_error would tell the edge's circuit breaker; they ended the run
// with Cancel, which counted as the provider's success and reset its
// failure count (ten broken Responses and Messages
// requests in a row, the circuit still closed). They end it with Fail now,
// streamed or not; a clean answer still ends with Cancel alone.
func TestRegression_BrokenTunnelAnswerFailsTheRun(t *testing.T) {
	const broken = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"he\"}}]}\n\n" +
		"data: {\"error\":{\"message\":\"generation failed\",\"type\":\"server_error\"}}\n\n"
	const clean = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"he\"}}]}\n\n" +
		"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
	routes := []struct{ name, path, body string }{
		{"ollama chat", "/api/chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]`},
	}
	for _, rt := range routes {
		for _, stream := range []bool{true, false} {
			for _, answer := range []string{broken, clean} {
				name := rt.name
				if stream {
					name += "/stream"
				}
				wantFail := answer == broken
				if wantFail {
					name += "/broken"
				}
				t.Run(name, func(t *testing.T) {
					run := scriptedRun(contract.PathTunnel,
						tunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}),
						tunnelData(answer),
						&nodev1.RunUp{Msg: &nodev1.RunUp_TunnelEnd{TunnelEnd: &nodev1.TunnelEnd{}}})
					env := newEnv(t, Config{}, runWith(run))
					streamFlag := `,"stream":false}`
					if stream {
						streamFlag = `,"stream":true}`
					}
					env.post(t, rt.path, "application/json", rt.body+streamFlag)
					failed := false
					for _, r := range run.cancelReasons() {
						failed = failed || strings.HasPrefix(r, "fail: ")
					}
					if failed != wantFail {
						t.Errorf("run ended with Fail: %v, want %v (cancels %q)", failed, wantFail, run.cancelReasons())
					}
				})
			}
		}
	}
}
