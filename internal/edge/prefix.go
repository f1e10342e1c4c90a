package edge

import (
	"encoding/binary"
	"encoding/json"
	"hash/maphash"
	"sync"

	"iop/internal/edge/contract"
	"iop/internal/scheduler"

	"iop/internal/modelname"
)

// Routing names how the edge chooses a provider among the candidates with a
// free slot (Config.Routing, ModelConfig.Routing).
type Routing string

const (
	// RoutingPrefix prefers the provider expected to hold the longest
	// prefix of the request's prompt in its cache, traded against load
	// (prefix-cache-aware routing; see prefixIndex). The default.
	RoutingPrefix Routing = "prefix"
	// RoutingLeastLoaded chooses the lowest in-flight/capacity (ties by
	// provider id, then node id), as before prefix routing.
	RoutingLeastLoaded Routing = "least_loaded"
)

// valid reports whether r is a routing ("" too when empty is allowed).
func (r Routing) valid(empty bool) bool {
	return r == RoutingPrefix || r == RoutingLeastLoaded || (empty && r == "")
}

// Defaults of prefix routing.
const (
	// DefaultPrefixIndexBlocks bounds the prefix index of one served model,
	// in blocks (Config.PrefixIndexBlocks).
	DefaultPrefixIndexBlocks = 16384
	// DefaultPrefixLoadSlack is Config.PrefixLoadSlack's default.
	DefaultPrefixLoadSlack = 0.5
)

// prefixBlockChars is the size of one block of a rendered prompt, in bytes:
// 16 tokens at the edge's estimate of 4 characters a token, as an engine's
// 16-token KV block.
const prefixBlockChars = 64

// prefixBlockTokens is the tokens one block is expected to be.
const prefixBlockTokens = prefixBlockChars / 4

// prefixHolders is how many providers one block remembers (the most
// recent first): a block shared by every conversation (a system prompt)
// lives on many providers.
const prefixHolders = 8

// prefixSeed seeds every block hash of this process: hashes are compared
// only within it.
var prefixSeed = maphash.MakeSeed()

// promptBlocks renders the prompt of a dispatched request (its canonical
// body: an OpenAI chat or completion request, whatever API the client used)
// and returns the chained hashes of its full blocks of prefixBlockChars
// bytes: block i's hash covers the model-independent text of blocks 0..i,
// so two prompts share a block hash only when they share all the text up
// to its end. The rendering is the tools' JSON, then each message in order
// (role, content text or the raw JSON of content parts, the raw JSON of
// tool calls and the tool call id), so a conversation's next turn, which
// appends messages, starts with the same blocks. A completion's prompt is
// its string, or the raw JSON of a token or batch prompt. Embeddings and
// bodies that do not parse have no blocks (nil).
//
// It reads body in place, once (scanPromptBlocks), and decodes it only
// when a key is spelled in a way only encoding/json settles.
func promptBlocks(op contract.Operation, body []byte) []uint64 {
	if blocks, ok := scanPromptBlocks(op, body); ok {
		return blocks
	}
	return decodePromptBlocks(op, body)
}

// decodePromptBlocks is promptBlocks by decoding body with encoding/json:
// the definition scanPromptBlocks keeps to, and its fallback.
func decodePromptBlocks(op contract.Operation, body []byte) []uint64 {
	var text []byte
	switch op {
	case contract.OperationChat:
		var b struct {
			Tools    json.RawMessage `json:"tools"`
			Messages []struct {
				Role       string          `json:"role"`
				Content    json.RawMessage `json:"content"`
				ToolCalls  json.RawMessage `json:"tool_calls"`
				ToolCallID string          `json:"tool_call_id"`
			} `json:"messages"`
		}
		if json.Unmarshal(body, &b) != nil {
			return nil
		}
		text = append(text, b.Tools...)
		for _, m := range b.Messages {
			text = append(text, "\x00"+m.Role+"\x00"...)
			text = appendJSONText(text, m.Content)
			text = append(text, m.ToolCalls...)
			text = append(text, m.ToolCallID...)
		}
	case contract.OperationCompletion:
		var b struct {
			Prompt json.RawMessage `json:"prompt"`
		}
		if json.Unmarshal(body, &b) != nil {
			return nil
		}
		text = appendJSONText(text, b.Prompt)
	default:
		return nil
	}
	return chainHashes(text)
}

// appendJSONText appends v's string value if v is a JSON string, else v's
// raw JSON.
func appendJSONText(dst []byte, v json.RawMessage) []byte {
	if len(v) > 0 && v[0] == '"' {
		var s string
		if json.Unmarshal(v, &s) == nil {
			return append(dst, s...)
		}
	}
	return append(dst, v...)
}

// chainHashes returns the chained hashes of text's full blocks.
func chainHashes(text []byte) []uint64 {
	n := len(text) / prefixBlockChars
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	var h maphash.Hash
	h.SetSeed(prefixSeed)
	var prev [8]byte
	for i := range n {
		h.Reset()
		h.Write(prev[:])
		h.Write(text[i*prefixBlockChars : (i+1)*prefixBlockChars])
		out[i] = h.Sum64()
		binary.LittleEndian.PutUint64(prev[:], out[i])
	}
	return out
}

// prefixIndex is the edge's approximate view of the providers' prompt
// caches: per served model, which providers recently received which block
// chains. It is only a guess (a provider may have evicted a block, or
// restarted): it never decides whether a request is served, only where.
// Memory is bounded: each served model keeps at most maxBlocks blocks, in
// LRU order (a request's blocks are touched last to first, so a chain's
// shared beginning outlives its tail, as in the engines' own caches), each
// remembering at most prefixHolders providers, so an index costs about
// maxBlocks × (8 + 32 × prefixHolders + map and list overhead) bytes per
// served model dispatched to (about 5 MiB at the default 16384 blocks).
//
// Concurrency: mu guards models and every modelIndex; it is a leaf lock,
// taken by match (before the scheduler's Admit) and record (after it),
// never under the scheduler's lock nor with another lock held.
type prefixIndex struct {
	maxBlocks int

	// mu guards the fields below; a leaf lock, taken by match before
	// Admit and by record after it, never under the scheduler's lock (the
	// Affinity the scheduler calls reads the map match returned, which
	// nothing modifies).
	mu     sync.Mutex
	models map[string]*modelIndex
}

// modelIndex is the blocks of one served model.
type modelIndex struct {
	blocks     map[uint64]*prefixBlock
	head, tail *prefixBlock // most and least recently used
}

// prefixBlock is one block hash and the providers that received it, the
// most recent first.
type prefixBlock struct {
	hash       uint64
	holders    []scheduler.ProviderRef
	prev, next *prefixBlock
}

func newPrefixIndex(maxBlocks int) *prefixIndex {
	return &prefixIndex{maxBlocks: maxBlocks, models: make(map[string]*modelIndex)}
}

// affinityKey names one candidate's cache: a provider and a served model
// (its modelname.Key: the index keys every model by it, so "x" and
// "x:latest" share one index).
type affinityKey struct {
	scheduler.ProviderRef
	target string
}

// match returns, for each provider that holds a prefix of blocks of one
// of targets (served models), the length of its longest held prefix in
// tokens (blocks × prefixBlockTokens). The map is the caller's and is not
// modified after: a scheduler.Request.Affinity may read it under the
// scheduler's lock. nil when nothing matches.
func (x *prefixIndex) match(targets []string, blocks []uint64) map[affinityKey]int {
	if len(blocks) == 0 {
		return nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	var out map[affinityKey]int
	for _, t := range targets {
		target := modelname.Key(t)
		mi := x.models[target]
		if mi == nil {
			continue
		}
		first := mi.blocks[blocks[0]]
		if first == nil {
			continue
		}
		// active: the holders of every block so far.
		active := append([]scheduler.ProviderRef(nil), first.holders...)
		depth := 1
		for ; depth < len(blocks) && len(active) > 0; depth++ {
			b := mi.blocks[blocks[depth]]
			if b == nil {
				break
			}
			kept := active[:0]
			for _, ref := range active {
				if holds(b, ref) {
					kept = append(kept, ref)
				} else {
					out = setMax(out, affinityKey{ref, target}, depth*prefixBlockTokens)
				}
			}
			active = kept
		}
		for _, ref := range active {
			out = setMax(out, affinityKey{ref, target}, depth*prefixBlockTokens)
		}
	}
	return out
}

func holds(b *prefixBlock, ref scheduler.ProviderRef) bool {
	for _, h := range b.holders {
		if h == ref {
			return true
		}
	}
	return false
}

func setMax(m map[affinityKey]int, k affinityKey, v int) map[affinityKey]int {
	if m == nil {
		m = make(map[affinityKey]int)
	}
	m[k] = max(m[k], v)
	return m
}

// record notes that ref (serving target) received a prompt of blocks:
// each block gets ref as its most recent holder and becomes the most
// recently used, the first block last; blocks over the bound are evicted
// least recently used first.
func (x *prefixIndex) record(target string, ref scheduler.ProviderRef, blocks []uint64) {
	if len(blocks) == 0 || x.maxBlocks <= 0 {
		return
	}
	target = modelname.Key(target)
	x.mu.Lock()
	defer x.mu.Unlock()
	mi := x.models[target]
	if mi == nil {
		mi = &modelIndex{blocks: make(map[uint64]*prefixBlock)}
		x.models[target] = mi
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		b := mi.blocks[blocks[i]]
		if b == nil {
			b = &prefixBlock{hash: blocks[i]}
			mi.blocks[b.hash] = b
		} else {
			mi.unlink(b)
		}
		mi.pushFront(b)
		b.addHolder(ref)
	}
	for len(mi.blocks) > x.maxBlocks {
		b := mi.tail
		mi.unlink(b)
		delete(mi.blocks, b.hash)
	}
}

// blocks returns the blocks the index holds now, over every served model.
func (x *prefixIndex) blocks() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	n := 0
	for _, mi := range x.models {
		n += len(mi.blocks)
	}
	return n
}

// addHolder makes ref b's most recent holder, dropping the oldest one over
// prefixHolders.
func (b *prefixBlock) addHolder(ref scheduler.ProviderRef) {
	for i, h := range b.holders {
		if h == ref {
			copy(b.holders[1:i+1], b.holders[:i])
			b.holders[0] = ref
			return
		}
	}
	if len(b.holders) < prefixHolders {
		b.holders = append(b.holders, scheduler.ProviderRef{})
	}
	copy(b.holders[1:], b.holders[:len(b.holders)-1])
	b.holders[0] = ref
}

func (mi *modelIndex) unlink(b *prefixBlock) {
	if b.prev != nil {
		b.prev.next = b.next
	} else {
		mi.head = b.next
	}
	if b.next != nil {
		b.next.prev = b.prev
	} else {
		mi.tail = b.prev
	}
	b.prev, b.next = nil, nil
}

func (mi *modelIndex) pushFront(b *prefixBlock) {
	b.next = mi.head
	if mi.head != nil {
		mi.head.prev = b
	}
	mi.head = b
	if mi.tail == nil {
		mi.tail = b
	}
}

// routingPolicy is the routing of every model group, from one Config: the
// edge's and each alias's override. Never modified; a Reload swaps in a
// new one.
type routingPolicy struct {
	def     Routing
	aliases map[string]Routing
	slack   float64
}

func newRoutingPolicy(cfg Config) *routingPolicy {
	p := &routingPolicy{def: cfg.Routing, aliases: make(map[string]Routing), slack: cfg.prefixLoadSlack()}
	if p.def == "" {
		p.def = RoutingPrefix
	}
	for alias, m := range cfg.Models {
		if m.Routing != "" {
			p.aliases[alias] = m.Routing
		}
	}
	return p
}

// of returns the routing of model group model.
func (p *routingPolicy) of(model string) Routing {
	if p == nil {
		return RoutingLeastLoaded
	}
	if r, ok := p.aliases[model]; ok {
		return r
	}
	return p.def
}

// prefixRoute is what prefix routing knows of one admission: its prompt's
// blocks and the expected cached tokens of each provider that holds a
// prefix of them. The zero value routes least-loaded.
type prefixRoute struct {
	blocks  []uint64
	matched map[affinityKey]int
	slack   float64
}

// routeOf computes req's prefixRoute when its model routes by prefix and
// more than one provider serves it (catalog.choosable): with one, there
// is nothing to choose, and the body is not read (nor its blocks recorded:
// when a second provider comes, the first one's cache is unknown to the
// index, and requests go to the least loaded until it learns them). It
// takes the index's lock, so it runs before Admit, never under the
// scheduler's lock.
func (s *Service) routeOf(req contract.Request) prefixRoute {
	p := s.routing.Load()
	if s.prefix == nil || p.of(req.Model) != RoutingPrefix || !s.cat.choosable(req.Model) {
		return prefixRoute{}
	}
	blocks := promptBlocks(req.Operation, req.Body)
	if len(blocks) == 0 {
		return prefixRoute{}
	}
	targets, _ := s.cat.targets(req.Model)
	return prefixRoute{blocks: blocks, matched: s.prefix.match(targets, blocks), slack: p.slack}
}

// routeOfBlocks is routeOf for blocks a cluster follower computed: the
// leader matches them against its own index, which so learns the prompts
// of every edge. Like routeOf, it runs before Admit.
func (s *Service) routeOfBlocks(model string, blocks []uint64) prefixRoute {
	p := s.routing.Load()
	if s.prefix == nil || len(blocks) == 0 || p.of(model) != RoutingPrefix {
		return prefixRoute{}
	}
	targets, _ := s.cat.targets(model)
	return prefixRoute{blocks: blocks, matched: s.prefix.match(targets, blocks), slack: p.slack}
}

// affinity is the route's scheduler.Request.Affinity: nil when nothing
// matched (the scheduler then chooses the least loaded). It reads only the
// route's own map.
func (r prefixRoute) affinity() func(scheduler.Candidate) int {
	if len(r.matched) == 0 {
		return nil
	}
	m := r.matched
	return func(c scheduler.Candidate) int {
		return m[affinityKey{scheduler.ProviderRef{NodeID: c.NodeID, ProviderID: c.ProviderID}, modelname.Key(c.Target)}]
	}
}

// predicted is the tokens the route expected candidate c to hold.
func (r prefixRoute) predicted(c scheduler.Candidate) int {
	return r.matched[affinityKey{scheduler.ProviderRef{NodeID: c.NodeID, ProviderID: c.ProviderID}, modelname.Key(c.Target)}]
}
