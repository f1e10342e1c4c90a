package e2e

import (
	"testing"
	"time"

	"iop/internal/e2e/harness"
)

// TestAnthropicJavaScriptClient runs test/js/anthropic_*.mjs, the official
// `@anthropic-ai/sdk` client unchanged, against a real edge's /v1/messages
// and a node with an Ollama and an OpenAI-compatible simulator (one per
// execution path), and a thinking one of each for the thinking checks.
func TestAnthropicJavaScriptClient(t *testing.T) {
	harness.Parallel(t)
	runJSClientSuite(t, "anthropic_*.mjs", []string{"tools"}, "", 2*time.Minute)
}
