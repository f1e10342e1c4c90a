package anthropic

import (
	"iop/internal/edge/api"
	"iop/internal/edge/api/apitest"
	"testing"
)

// TestRegression_MessageStartInputTokensFromProvider: message_start's
// usage.input_tokens was the edge's estimate even when the provider had
// counted the prompt before the first token (an OpenAI-compatible stream
// with usage in its first event). It is the provider's count now; on the
// normalized path, where Ollama counts the prompt only at the end, it
// stays the estimate and message_delta carries the provider's count.
func TestRegression_MessageStartInputTokensFromProvider(t *testing.T) {
	const sseBody = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":42,"completion_tokens":1}}` + "\n\n" +
		`data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":42,"completion_tokens":2}}` + "\n\n" +
		"data: [DONE]\n\n"
	inputs := func(t *testing.T, body string) (start, delta any) {
		t.Helper()
		for _, e := range messagesEvents(t, body) {
			switch e.name {
			case "message_start":
				msg, _ := e.data["message"].(map[string]any)
				usage, _ := msg["usage"].(map[string]any)
				start = usage["input_tokens"]
			case "message_delta":
				usage, _ := e.data["usage"].(map[string]any)
				delta = usage["input_tokens"]
			}
		}
		return start, delta
	}
	t.Run("tunnel", func(t *testing.T) {
		env := newEnv(t, api.Config{}, runWith(apitest.ScriptedRun(apitest.Tunnel, apitest.TunnelHead(200, map[string]string{"Content-Type": "text/event-stream"}), apitest.TunnelData(sseBody), apitest.TunnelEnd())))
		resp := env.post(t, messagesPath, "application/json", messagesBody+`,"stream":true}`)
		if start, delta := inputs(t, resp.body); resp.status != 200 || start != float64(42) || delta != float64(42) {
			t.Fatalf("%d: message_start input_tokens %v, message_delta %v; want the provider's 42: %s", resp.status, start, delta, resp.body)
		}
	})
	t.Run("normalized", func(t *testing.T) {
		env := newEnv(t, api.Config{}, runWith(apitest.ScriptedRun(apitest.Normalized, apitest.Events(apitest.Started(), apitest.Delta("hi")), apitest.Events(apitest.Usage(42, 2), apitest.Complete("stop")))))
		resp := env.post(t, messagesPath, "application/json", messagesBody+`,"stream":true}`)
		if start, delta := inputs(t, resp.body); resp.status != 200 || start == float64(42) || delta != float64(42) {
			t.Fatalf("%d: message_start input_tokens %v (the estimate), message_delta %v (want 42): %s", resp.status, start, delta, resp.body)
		}
	})
}
