package e2e

import (
	"testing"
	"time"

	"iop/internal/e2e/harness"
)

// TestResponsesJavaScriptClients runs test/js/responses_*.mjs, the official
// clients of OpenAI's Responses API (`openai` responses.*, the OpenAI
// Agents SDK in its default mode, the AI SDK's default openai(id)),
// unchanged against a real edge and node with an Ollama and an
// OpenAI-compatible simulator (one per execution path), and a thinking one
// of each for the reasoning summaries.
func TestResponsesJavaScriptClients(t *testing.T) {
	harness.Parallel(t)
	runJSClientSuite(t, "responses_*.mjs", []string{"tools", "vision"}, "/v1", 3*time.Minute)
}
