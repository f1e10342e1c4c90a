package api

import (
	"testing"
)

// TestOpenAIClientOllamaFieldsTravelApartFromTheBody: an OpenAI client's
// "iop_ollama" object (README: its way to Ollama-only settings) leaves the
// body it sent, every other byte as it was, and goes as the request's
// OllamaFields, its JSON unchanged, on each OpenAI route; null is no
// fields; a body without the member is dispatched as it came.
func TestOpenAIClientOllamaFieldsTravelApartFromTheBody(t *testing.T) {
	t.Parallel()
	chat := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		name, path, body, wantBody, wantFields string
	}{
		{"chat", "/v1/chat/completions",
			`{"model":"m",` + chat + `, "iop_ollama" : {"keep_alive":"24h","options":{"num_ctx":8192}},"temperature":1.50}`,
			`{"model":"m",` + chat + `,"temperature":1.50}`, `{"keep_alive":"24h","options":{"num_ctx":8192}}`},
		{"chat, first member and a duplicate", "/v1/chat/completions",
			`{"iop_ollama":{"think":true},"model":"m",` + chat + `,"iop_ollama":{"think":false}}`,
			`{"model":"m",` + chat + `}`, `{"think":false}`},
		{"chat, null", "/v1/chat/completions", `{"model":"m",` + chat + `,"iop_ollama":null}`, `{"model":"m",` + chat + `}`, ``},
		{"chat, not an object: the node's to refuse", "/v1/chat/completions", `{"model":"m",` + chat + `,"iop_ollama":"x"}`, `{"model":"m",` + chat + `}`, `"x"`},
		{"chat, none", "/v1/chat/completions", "{\"model\":\"m\",\n" + chat + "}", "{\"model\":\"m\",\n" + chat + "}", ``},
		{"completions", "/v1/completions", `{"model":"m","prompt":"p","iop_ollama":{"raw":true}}`, `{"model":"m","prompt":"p"}`, `{"raw":true}`},
		{"embeddings", "/v1/embeddings", `{"model":"m","input":"a","iop_ollama":{"truncate":false}}`, `{"model":"m","input":"a"}`, `{"truncate":false}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := newEnv(t, Config{}, failWith(ErrQueueFull))
			env.post(t, c.path, "application/json", c.body)
			reqs := env.gw.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d dispatches, want 1", len(reqs))
			}
			if got := string(reqs[0].Body); got != c.wantBody {
				t.Errorf("body %q, want %q", got, c.wantBody)
			}
			if got := string(reqs[0].OllamaFields); got != c.wantFields {
				t.Errorf("Ollama fields %q, want %q", got, c.wantFields)
			}
		})
	}
}
