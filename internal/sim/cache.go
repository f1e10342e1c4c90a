package sim

import (
	"container/list"
	"encoding/binary"
	"hash/fnv"
	"strings"
	"time"
)

// PrefixBlockTokens is the size of one prompt block of the simulated prefix
// cache, in tokens (the simulator's tokens: whitespace-separated words of
// the rendered prompt), as vLLM's default block size.
const PrefixBlockTokens = 16

// prefixCache is a simulated engine's prefix (KV) cache: an LRU of full
// prompt blocks, each named by a chained hash that covers the model and
// every block before it (vLLM's automatic prefix caching), so a block hits
// only when the whole prompt up to its end was seen before. Not safe for
// concurrent use: Server.mu guards it.
type prefixCache struct {
	maxBlocks int
	blocks    map[uint64]*list.Element // hash → element of lru (Value: hash)
	lru       *list.List               // front: most recently used
}

func newPrefixCache(tokens int) *prefixCache {
	return &prefixCache{maxBlocks: tokens / PrefixBlockTokens, blocks: make(map[uint64]*list.Element), lru: list.New()}
}

// prefixOutcome is what the cache did with one prompt: hit and missed
// blocks, and its tokens served from the cache and computed (prefilled).
// The tokens after the last full block always count as missed.
type prefixOutcome struct {
	HitBlocks, MissBlocks int
	HitTokens, MissTokens int
}

// blockHashes returns the chained hashes of words' full blocks.
func blockHashes(model string, words []string) []uint64 {
	h := fnv.New64a()
	h.Write([]byte(model))
	prev := h.Sum64()
	out := make([]uint64, 0, len(words)/PrefixBlockTokens)
	var buf [8]byte
	for i := 0; i+PrefixBlockTokens <= len(words); i += PrefixBlockTokens {
		h.Reset()
		binary.LittleEndian.PutUint64(buf[:], prev)
		h.Write(buf[:])
		h.Write([]byte(strings.Join(words[i:i+PrefixBlockTokens], " ")))
		prev = h.Sum64()
		out = append(out, prev)
	}
	return out
}

// admit looks the prompt up, then caches all its full blocks (a request's
// blocks stay cached after it, as an engine keeps them for reuse), and
// evicts least recently used blocks over the bound. A prompt's blocks are
// touched last to first, so its first blocks are the most recent: an
// eviction takes the end of a chain before its shared beginning (vLLM
// evicts a chain's tail first). With maxBlocks 0 nothing is cached.
func (c *prefixCache) admit(model, prompt string) prefixOutcome {
	words := strings.Fields(prompt)
	hashes := blockHashes(model, words)
	hit := 0
	for hit < len(hashes) {
		if _, ok := c.blocks[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	if c.maxBlocks > 0 {
		for i := len(hashes) - 1; i >= 0; i-- {
			if e, ok := c.blocks[hashes[i]]; ok {
				c.lru.MoveToFront(e)
				continue
			}
			c.blocks[hashes[i]] = c.lru.PushFront(hashes[i])
		}
		for c.lru.Len() > c.maxBlocks {
			e := c.lru.Back()
			delete(c.blocks, e.Value.(uint64))
			c.lru.Remove(e)
		}
	}
	return prefixOutcome{
		HitBlocks: hit, MissBlocks: len(hashes) - hit,
		HitTokens: hit * PrefixBlockTokens, MissTokens: len(words) - hit*PrefixBlockTokens,
	}
}

// prefillTime is how long computing tokens takes at rate tokens/second (0
// when rate is 0: prefill costs nothing).
func prefillTime(tokens int, rate float64) time.Duration {
	if rate <= 0 || tokens <= 0 {
		return 0
	}
	return time.Duration(float64(tokens) / rate * float64(time.Second))
}
