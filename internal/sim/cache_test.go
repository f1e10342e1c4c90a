package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// words returns n distinct words tagged with tag ("tag0 tag1 ...").
func words(tag string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return strings.Join(w, " ")
}

// TestPrefixCacheRule checks the cache from its rule: blocks of 16 tokens
// with chained hashes; a repeated prompt hits every full block; a prompt
// that changes in its middle hits up to the changed block and misses from
// there on, even where later text is the same; an extended prompt hits its
// old blocks; the LRU holds N tokens and evicts the least recently used;
// another model shares nothing.
func TestPrefixCacheRule(t *testing.T) {
	c := newPrefixCache(10 * PrefixBlockTokens)
	p := words("a", 64+5) // 4 full blocks and 5 tokens
	if got, want := c.admit("m", p), (prefixOutcome{MissBlocks: 4, MissTokens: 69}); got != want {
		t.Fatalf("first: %+v, want %+v", got, want)
	}
	if got, want := c.admit("m", p), (prefixOutcome{HitBlocks: 4, HitTokens: 64, MissTokens: 5}); got != want {
		t.Fatalf("repeat: %+v, want %+v", got, want)
	}
	// Token 20 (block 1) changed: block 0 hits, blocks 1-3 miss.
	f := strings.Fields(p)
	f[20] = "changed"
	if got, want := c.admit("m", strings.Join(f, " ")), (prefixOutcome{HitBlocks: 1, MissBlocks: 3, HitTokens: 16, MissTokens: 53}); got != want {
		t.Fatalf("changed middle: %+v, want %+v", got, want)
	}
	// Grown by a turn: the 4 old blocks hit.
	if got, want := c.admit("m", p+" "+words("b", 27)), (prefixOutcome{HitBlocks: 4, MissBlocks: 2, HitTokens: 64, MissTokens: 32}); got != want {
		t.Fatalf("grown: %+v, want %+v", got, want)
	}
	if got, want := c.admit("other", p), (prefixOutcome{MissBlocks: 4, MissTokens: 69}); got != want {
		t.Fatalf("other model: %+v, want %+v", got, want)
	}
	if n := c.lru.Len(); n != 10 {
		t.Fatalf("cached %d blocks, want the bound 10", n)
	}
	// 4+3+2 blocks of model m and 4 of "other" were made: 13 > 10, so the
	// 3 least recent went: the changed prompt's 3 blocks (used before the
	// grown one and "other").
	if got := c.admit("m", strings.Join(f, " ")); got.HitBlocks != 1 {
		t.Fatalf("after eviction, changed prompt hit %d blocks, want 1 (its own tail evicted)", got.HitBlocks)
	}
}

// TestPrefixCacheEvictsTailFirst: when a chain must lose blocks, its
// first blocks stay (they are shared by every longer prompt).
func TestPrefixCacheEvictsTailFirst(t *testing.T) {
	c := newPrefixCache(4 * PrefixBlockTokens)
	p := words("a", 4*PrefixBlockTokens)
	c.admit("m", p)
	c.admit("m", words("z", 2*PrefixBlockTokens)) // 2 more blocks: 2 of p go
	if got := c.admit("m", p); got.HitBlocks != 2 {
		t.Fatalf("hit %d blocks of p, want its first 2", got.HitBlocks)
	}
}

// TestPrefillTimeAndStats checks, over HTTP on both protocols, that the
// time to first token is TTFT + uncached tokens / rate, and that GET
// /stats reports the hits and misses.
func TestPrefillTimeAndStats(t *testing.T) {
	for _, ep := range endpoints {
		t.Run(ep.name, func(t *testing.T) {
			clk := newFakeClock(false)
			_, url, _ := startSim(t, Config{Protocol: ep.protocol, TTFT: 10 * time.Millisecond, PrefixCacheTokens: 1000,
				PrefillTokensPerSecond: 1000, Clock: clk})
			c := newClient(t)
			prompt := words("w", 100) // 6 full blocks, 4 tokens over
			for range 2 {
				if got := ep.read(t, mustPost(t, c, url+ep.path, ep.body(DefaultModel, prompt, false, 1)), false); !got.complete {
					t.Fatal("incomplete answer")
				}
			}
			// First: 100 tokens at 1000/s = 100 ms; then 4 uncached = 4 ms.
			want := []time.Duration{110 * time.Millisecond, 14 * time.Millisecond}
			if w := clk.waited(); !slices.Equal(w, want) {
				t.Fatalf("waited %v, want %v", w, want)
			}
			resp, err := c.Get(url + "/stats")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var st Stats
			if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&st) != nil {
				t.Fatalf("GET /stats: %d", resp.StatusCode)
			}
			if st.PrefixHitBlocks != 6 || st.PrefixMissBlocks != 6 || st.PrefixHitTokens != 96 || st.PrefixMissTokens != 104 || st.PrefixCachedBlocks != 6 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestPrefixCacheKeepsTheAnswer: a request's answer is cached after its
// prompt, so the conversation's next turn (prompt, answer, a new message)
// hits the answer's full blocks too.
func TestPrefixCacheKeepsTheAnswer(t *testing.T) {
	s, err := New(Config{Protocol: ProtocolOpenAI, PrefixCacheTokens: 1000, DefaultMaxTokens: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := request{model: DefaultModel, prompt: words("p", 32), maxTokens: noLimit}
	s.prefill(first)
	answer := complete(0, 16, first).text()
	next := request{model: DefaultModel, prompt: first.prompt + "\n" + answer + "\n" + words("q", 16), maxTokens: noLimit}
	s.prefill(next)
	if st := s.Stats(); st.PrefixHitBlocks != 3 || st.PrefixMissBlocks != 2+1 {
		t.Fatalf("stats %+v: want the next turn to hit the prompt's 2 blocks and the answer's 1", st)
	}
}
