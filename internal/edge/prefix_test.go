package edge

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"
)

func chatBody(t testing.TB, msgs ...string) []byte {
	t.Helper()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []msg
	for i, m := range msgs {
		role := "user"
		if i == 0 {
			role = "system"
		} else if i%2 == 0 {
			role = "assistant"
		}
		ms = append(ms, msg{role, m})
	}
	b, err := json.Marshal(map[string]any{"model": "m", "messages": ms, "stream": true})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPromptBlocksGrowWithTheConversation: a conversation's next turn
// (the answer and a new user message appended) starts with every block of
// the turn before; a change in the middle changes every block from there;
// the same prompt in a completion body hashes the same way as its text.
func TestPromptBlocksGrowWithTheConversation(t *testing.T) {
	sys := strings.Repeat("You are a helpful assistant. ", 20) // 560 chars
	turn1 := promptBlocks(contract.OperationChat, chatBody(t, sys, "What is a KV cache?"))
	turn2 := promptBlocks(contract.OperationChat, chatBody(t, sys, "What is a KV cache?", strings.Repeat("It keeps keys and values. ", 10), "And prefix caching?"))
	if len(turn1) < 8 || len(turn2) <= len(turn1) {
		t.Fatalf("blocks: turn 1 %d, turn 2 %d", len(turn1), len(turn2))
	}
	for i := range turn1 {
		if turn1[i] != turn2[i] {
			t.Fatalf("block %d of turn 1 differs in turn 2", i)
		}
	}
	// Rendered: "\x00system\x00" (8 bytes), sys (560), "\x00user\x00" (6),
	// then the user text, whose 4th byte (577: block 9) changes.
	changed := promptBlocks(contract.OperationChat, chatBody(t, sys, "Whom is a KV cache?"))
	for i := range turn1 {
		same := changed[i] == turn1[i]
		if want := i < 577/prefixBlockChars; same != want {
			t.Fatalf("block %d: same=%v after a change in block 9", i, same)
		}
	}
	if got := promptBlocks(contract.OperationChat, []byte(`{"messages": 3}`)); got != nil {
		t.Fatalf("a body that does not parse has blocks %v", got)
	}
	if got := promptBlocks(contract.OperationEmbeddings, chatBody(t, sys)); got != nil {
		t.Fatal("embeddings have blocks")
	}
	prompt := strings.Repeat("abcdefgh", 40)
	a := promptBlocks(contract.OperationCompletion, []byte(`{"model":"m","prompt":"`+prompt+`"}`))
	b := promptBlocks(contract.OperationCompletion, []byte(`{"model":"m","prompt":"`+prompt+`0123456789"}`))
	if len(a) != 5 || len(b) != 5 || a[4] != b[4] {
		t.Fatalf("completion blocks %d %d", len(a), len(b))
	}
}

func ref(p string) scheduler.ProviderRef { return scheduler.ProviderRef{NodeID: "n", ProviderID: p} }

// TestPrefixIndexMatch: the longest held prefix per provider, for the
// served model it was recorded for only; a provider that holds a later
// block but not an earlier one matches only up to the gap.
func TestPrefixIndexMatch(t *testing.T) {
	x := newPrefixIndex(100)
	long := []uint64{1, 2, 3, 4, 5}
	x.record("t", ref("a"), long[:3])
	x.record("t", ref("b"), long)
	x.record("t", ref("c"), []uint64{1, 9, 3, 4})
	x.record("other", ref("d"), long)
	got := x.match([]string{"t"}, long)
	want := map[affinityKey]int{
		{ref("a"), "t:latest"}: 3 * prefixBlockTokens,
		{ref("b"), "t:latest"}: 5 * prefixBlockTokens,
		{ref("c"), "t:latest"}: 1 * prefixBlockTokens,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("match %v, want %v", got, want)
	}
	if got := x.match([]string{"t"}, []uint64{7, 1, 2}); got != nil {
		t.Fatalf("a prompt whose first block nobody holds matched %v", got)
	}
	if got := x.match([]string{"t", "other"}, long); got[affinityKey{ref("d"), "other:latest"}] != 5*prefixBlockTokens {
		t.Fatalf("alias with two targets: %v", got)
	}
	// One model under the name rule: "t:latest" recorded, "t" matched.
	x.record("u:latest", ref("e"), long)
	if got := x.match([]string{"u"}, long); got[affinityKey{ref("e"), "u:latest"}] != 5*prefixBlockTokens {
		t.Fatalf("u:latest recorded, u matched: %v", got)
	}
	r := prefixRoute{matched: x.match([]string{"u"}, long)}
	if got := r.affinity()(scheduler.Candidate{NodeID: "n", ProviderID: "e", Target: "u:latest"}); got != 5*prefixBlockTokens {
		t.Fatalf("the candidate serving u:latest has affinity %d", got)
	}
}

// TestPrefixIndexBounded: the index never holds more than its bound of
// blocks per served model, evicts the least recently used, and keeps a
// chain's shared beginning over its tail; each block holds at most
// prefixHolders providers.
func TestPrefixIndexBounded(t *testing.T) {
	x := newPrefixIndex(64)
	for i := range 1000 {
		chain := make([]uint64, 10)
		chain[0] = 1 // a shared first block
		for j := 1; j < 10; j++ {
			chain[j] = uint64(i*100 + j)
		}
		x.record("t", ref(fmt.Sprint("p", i%20)), chain)
		if n := x.blocks(); n > 64 {
			t.Fatalf("after %d prompts the index holds %d blocks, bound 64", i+1, n)
		}
	}
	mi := x.models["t:latest"]
	if b := mi.blocks[1]; b == nil || len(b.holders) != prefixHolders {
		t.Fatalf("shared block: %+v", b)
	}
	if mi.blocks[uint64(999*100+9)] == nil || mi.blocks[uint64(100+9)] != nil {
		t.Fatal("LRU order: the newest chain's tail is kept, an old one's evicted")
	}
}

// BenchmarkPromptBlocks measures hashing a chat body of 8,000 characters
// of prompt (about 2,000 tokens) and matching it in a full index.
func BenchmarkPromptBlocks(b *testing.B) {
	body := chatBody(b, strings.Repeat("x", 6000), strings.Repeat("y", 2000))
	x := newPrefixIndex(DefaultPrefixIndexBlocks)
	x.record("m", ref("a"), promptBlocks(contract.OperationChat, body))
	b.ReportAllocs()
	for b.Loop() {
		x.match([]string{"m"}, promptBlocks(contract.OperationChat, body))
	}
}

// agentBody is an agent's chat request of about 95 KiB
// (testdata/agent_100k.json): 20 tool definitions, a 6,000-character
// system prompt, and 25 rounds of a user turn, an assistant tool call, a
// tool result of source code (tabs, newlines, quotes) and an answer; text
// with non-ASCII runes.
func agentBody(tb testing.TB) []byte {
	tb.Helper()
	body, err := os.ReadFile("testdata/agent_100k.json")
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// BenchmarkPromptBlocksAgent measures the prompt blocks of an agent's
// 95 KiB chat request (agentBody), per request.
func BenchmarkPromptBlocksAgent(b *testing.B) {
	body := agentBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if promptBlocks(contract.OperationChat, body) == nil {
			b.Fatal("no blocks")
		}
	}
}
