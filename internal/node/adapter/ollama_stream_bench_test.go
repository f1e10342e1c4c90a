package adapter

import "testing"

// BenchmarkParseOllamaLine measures the node's parse of one line of an
// Ollama /api/chat stream (parseLine), per line: a token line as Ollama
// and iop sim send it, and the final line with counters.
func BenchmarkParseOllamaLine(b *testing.B) {
	for _, bc := range []struct{ name, line string }{
		{"token", `{"model":"bench-ollama","created_at":"2026-01-01T00:00:00.123456789Z","message":{"role":"assistant","content":" token"},"done":false}`},
		{"done", `{"model":"bench-ollama","created_at":"2026-01-01T00:00:00.123456789Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":1234567,"load_duration":1,"prompt_eval_count":17,"prompt_eval_duration":2345,"eval_count":16,"eval_duration":345678}`},
	} {
		line := []byte(bc.line)
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := parseLine(line); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
