package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/sim"
)

// TestBatchLinesOfOnePrefixGoToItsProvider: batch lines are routed by
// prefix as interactive requests are. Three conversations' system prompts
// (A, B, C) are first sent interactively as long answers, one after the
// other, so that least-loaded places them on providers a, b and c (each
// stays busy while the next is placed). Once they are stopped, a batch of
// 12 chat lines for alias pool, the three prompts interleaved with a
// question of their own, runs at once: each provider gets exactly its
// prompt's 4 lines, and prefills none of their system prompts again (its
// simulator's prefix-cache misses grow by less than one system prompt).
// Lines placed least-loaded would spread the prompts over the providers
// and miss.
func TestBatchLinesOfOnePrefixGoToItsProvider(t *testing.T) {
	harness.Parallel(t)
	st := startPrefixStack(t, sim.ProtocolOllama, 32)
	groups := []string{"A", "B", "C"}
	system := map[string]string{}
	home := map[string]string{} // group → the provider that holds its prompt
	missOfPrompt := int64(0)
	var stops []func()
	for _, g := range groups {
		// A system prompt long beside what a line adds (its question, the
		// last partial block): a line of another prompt would prefill
		// more than all 4 lines of its own.
		system[g] = strings.Repeat(fmt.Sprintf("You are assistant %s and answer briefly. ", g), 100)
		misses := st.misses()
		var stop func()
		home[g], stop = st.block(t, "pool", []chatMessage{{"system", system[g]}, {"user", "who are you?"}})
		stops = append(stops, stop)
		if m := st.misses()[home[g]] - misses[home[g]]; missOfPrompt == 0 || m < missOfPrompt {
			missOfPrompt = m
		}
	}
	for _, stop := range stops {
		stop()
	}
	if home["A"] == home["B"] || home["B"] == home["C"] || home["A"] == home["C"] {
		t.Fatalf("the prompts landed on %v, want three providers", home)
	}
	t.Logf("prompts on %v; a prompt's first prefill: %d tokens", home, missOfPrompt)

	var in strings.Builder
	for i := range 12 {
		g := groups[i%3]
		msgs := []chatMessage{{"system", system[g]}, {"user", fmt.Sprintf("question %d", i)}}
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("%s-%d", g, i), "method": "POST", "url": "/v1/chat/completions",
			"body": map[string]any{"model": "pool", "max_tokens": 2, "messages": msgs}})
		in.Write(line)
		in.WriteByte('\n')
	}
	requests, misses := st.requests(), st.misses()
	c := batchAPI{t: t, base: "http://" + st.e.HTTPAddr}
	b := c.waitBatch(c.createBatch(c.uploadFile(in.String()), "/v1/chat/completions"), "completed", "failed")
	if out := c.resultLines(b["output_file_id"].(string)); len(out) != 12 {
		t.Fatalf("batch %v: %d output lines, want 12", b, len(out))
	}
	for g, p := range home {
		if n := st.requests()[p] - requests[p]; n != 4 {
			t.Errorf("provider %s (prompt %s) got %d batch lines, want its prompt's 4", p, g, n)
		}
		if m := st.misses()[p] - misses[p]; m >= missOfPrompt {
			t.Errorf("provider %s (prompt %s) prefilled %d tokens for 4 lines, a system prompt's worth (%d) or more: a line of another prompt reached it", p, g, m, missOfPrompt)
		}
	}
}

// requests returns the inference requests each simulator admitted so far.
func (st *prefixStack) requests() map[string]int64 {
	out := map[string]int64{}
	for id, s := range st.sims {
		out[id] = s.Stats().Admitted
	}
	return out
}

// misses returns the prompt tokens each simulator prefilled so far (not
// found in its prefix cache).
func (st *prefixStack) misses() map[string]int64 {
	out := map[string]int64{}
	for id, s := range st.sims {
		out[id] = s.Stats().PrefixMissTokens
	}
	return out
}
