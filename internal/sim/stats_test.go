package sim

import (
	"testing"
	"time"

	"iop/internal/clock"
)

// TestStatsCountOutputTokensPerMinute: /stats counts every output token
// and the most delivered in any 60 whole seconds of the server's clock.
func TestStatsCountOutputTokensPerMinute(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s, base, _ := startSim(t, Config{Protocol: ProtocolOllama, Models: []string{"a"}, Clock: clk, DefaultMaxTokens: 5})
	c := newClient(t)
	chat := func() {
		resp := mustPost(t, c, base+"/api/chat", map[string]any{"model": "a", "stream": false,
			"messages": []map[string]string{{"role": "user", "content": "hi"}}})
		if resp.StatusCode != 200 {
			t.Fatalf("chat: %d", resp.StatusCode)
		}
	}
	chat()
	chat()
	clk.Advance(30 * time.Second)
	chat()
	chat() // 20 tokens within a minute
	clk.Advance(31 * time.Second)
	chat() // the first 10 are out of the minute: 15
	st := s.Stats()
	if st.OutputTokens != 25 || st.MaxTokensPerMinute != 20 {
		t.Fatalf("output_tokens %d, max_tokens_per_minute %d; want 25, 20", st.OutputTokens, st.MaxTokensPerMinute)
	}
}
