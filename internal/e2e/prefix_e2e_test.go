package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// prefixStack is an edge and one node with providers a, b and c of
// capacity 1, each its own simulator with a prefix cache, on one
// execution path. Model "m" is served; alias "pool" routes by the edge's
// routing (prefix, the default), alias "pool-ll" least-loaded.
type prefixStack struct {
	e    *process.Process
	sims map[string]*sim.Server // by provider id
}

var prefixProviders = []string{"a", "b", "c"}

func startPrefixStack(t *testing.T, protocol sim.Protocol, capacity int) *prefixStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Database = ":memory:"
	cfg.Models = map[string]edge.ModelConfig{
		"pool":    {Targets: []string{"m"}, MaxQueue: 64},
		"pool-ll": {Targets: []string{"m"}, MaxQueue: 64, Routing: edge.RoutingLeastLoaded},
	}
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	st := &prefixStack{e: e, sims: map[string]*sim.Server{}}
	var provs []node.ProviderConfig
	for _, id := range prefixProviders {
		// A slow token rate and a length of 300 s keep a long answer (a
		// blocker) in flight until it is stopped; every other request
		// sets a short limit. (With the simulator's 16 tokens a blocker
		// ended by itself 0.2 s after its start, and on a loaded machine a
		// turn meant for the free provider went to a blocker's.) No
		// longer: the simulator builds an answer whole at its admission,
		// and one of 200,000 tokens took a second of CPU under -race.
		s, url := harness.Sim(t, sim.Config{Protocol: protocol, Models: []string{"m"}, MaxConcurrent: capacity,
			TokensPerSecond: 100, DefaultMaxTokens: 30_000, PrefixCacheTokens: 100_000})
		st.sims[id] = s
		p := node.ProviderConfig{ID: id, Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: capacity}
		if protocol == sim.ProtocolOpenAI {
			p.Type, p.BaseURL = "openai", url+"/v1"
		}
		provs = append(provs, p)
	}
	harness.Node(t, ctx, node.Config{NodeID: "node-1", Edge: e.NodeAddr, Providers: provs})
	testenv.Eventually(t, "3 providers available", func() bool { return len(e.Service.Snapshot().Providers) == 3 })
	return st
}

// prompted returns the prompt tokens each simulator has seen so far.
func (st *prefixStack) prompted() map[string]int64 {
	out := map[string]int64{}
	for id, s := range st.sims {
		x := s.Stats()
		out[id] = x.PrefixHitTokens + x.PrefixMissTokens
	}
	return out
}

// hits returns each simulator's cache hits so far, in tokens.
func (st *prefixStack) hits() map[string]int64 {
	out := map[string]int64{}
	for id, s := range st.sims {
		out[id] = s.Stats().PrefixHitTokens
	}
	return out
}

// servedBy sends a request with do and returns the one provider whose
// simulator saw a prompt meanwhile.
func (st *prefixStack) servedBy(t *testing.T, do func()) string {
	t.Helper()
	before := st.prompted()
	do()
	var got []string
	for id, n := range st.prompted() {
		if n != before[id] {
			got = append(got, id)
		}
	}
	if len(got) != 1 {
		t.Fatalf("prompts reached %v, want exactly one provider", got)
	}
	return got[0]
}

// inFlight is the in-flight count of provider id's simulator.
func (st *prefixStack) inFlight(id string) int { return st.sims[id].Stats().InFlight }

// block starts a long streamed answer of model for messages and returns
// once its provider's simulator has it in flight, with the provider and a
// stop that ends it and waits until the simulator saw it end (the edge
// frees the slot at the client's cancel, a moment before the simulator
// notices).
func (st *prefixStack) block(t *testing.T, model string, messages []chatMessage) (string, func()) {
	t.Helper()
	before := map[string]int{}
	for _, id := range prefixProviders {
		before[id] = st.inFlight(id)
	}
	prompted := st.prompted()
	ctx, cancel := context.WithCancel(context.Background())
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": 30_000, "messages": messages})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+st.e.HTTPAddr+"/v1/chat/completions", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	var on string
	// In flight, and its prompt counted (the simulator counts it just
	// after it takes the slot), so no later servedBy sees it.
	testenv.Eventually(t, "the blocker in flight", func() bool {
		now := st.prompted()
		for _, id := range prefixProviders {
			if st.inFlight(id) > before[id] && now[id] > prompted[id] {
				on = id
				return true
			}
		}
		return false
	})
	stop := func() {
		cancel()
		<-done
		testenv.Eventually(t, "the blocker's end on its simulator", func() bool { return st.inFlight(on) == 0 })
	}
	t.Cleanup(stop) // also when the test failed before it stopped the blocker
	return on, stop
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// conversation is a chat that grows turn by turn: a long system prompt of
// its own, then user and assistant messages.
type conversation struct {
	system string
	turns  []chatMessage
}

func newConversation(tag string) *conversation {
	return &conversation{system: strings.Repeat(fmt.Sprintf("You are assistant %s and answer briefly. ", tag), 20)}
}

func (c *conversation) ask(q string)    { c.turns = append(c.turns, chatMessage{"user", q}) }
func (c *conversation) answer(a string) { c.turns = append(c.turns, chatMessage{"assistant", a}) }

func (c *conversation) messages() []chatMessage {
	return append([]chatMessage{{"system", c.system}}, c.turns...)
}

// text is the conversation as one prompt, for the prompt-based APIs.
func (c *conversation) text() string {
	var b strings.Builder
	b.WriteString(c.system)
	for _, m := range c.turns {
		b.WriteString("\n" + m.Role + ": " + m.Content)
	}
	return b.String()
}

// prefixAPIs are the client APIs prefix routing covers, each sending a
// conversation's current turn (a short answer) and failing t unless 200.
var prefixAPIs = []struct {
	name string
	path string
	body func(model string, c *conversation) any
}{
	{"chat", "/v1/chat/completions", func(model string, c *conversation) any {
		return map[string]any{"model": model, "max_tokens": 2, "messages": c.messages()}
	}},
	{"completions", "/v1/completions", func(model string, c *conversation) any {
		return map[string]any{"model": model, "max_tokens": 2, "prompt": c.text()}
	}},
	{"responses", "/v1/responses", func(model string, c *conversation) any {
		return map[string]any{"model": model, "max_output_tokens": 16, "store": false, "instructions": c.system, "input": c.turns}
	}},
	{"messages", "/v1/messages", func(model string, c *conversation) any {
		return map[string]any{"model": model, "max_tokens": 2, "system": c.system, "messages": c.turns}
	}},
	{"ollama chat", "/api/chat", func(model string, c *conversation) any {
		return map[string]any{"model": model, "stream": false, "options": map[string]any{"num_predict": 2}, "messages": c.messages()}
	}},
	{"ollama generate", "/api/generate", func(model string, c *conversation) any {
		return map[string]any{"model": model, "stream": false, "options": map[string]any{"num_predict": 2}, "prompt": c.text()}
	}},
}

func (st *prefixStack) send(t *testing.T, path string, body any) {
	t.Helper()
	raw, _ := json.Marshal(body)
	status, _, data := post(t, st.e, path, string(raw))
	if status != http.StatusOK {
		t.Fatalf("POST %s: %d %s", path, status, data)
	}
}

// TestPrefixRoutingSecondTurnGoesToItsProvider: a
// conversation's first turn lands on c, the only free provider (a and b
// hold blockers with unrelated prompts, placed least-loaded: no prefix
// matches them). Once everything is idle again, its second turn goes back
// to c, which holds its prefix (c's cache hits), although least-loaded
// would choose a; with routing least_loaded (alias pool-ll) it goes to a,
// today's choice. For every client API, on both execution paths.
func TestPrefixRoutingSecondTurnGoesToItsProvider(t *testing.T) {
	harness.ParallelLong(t)
	for _, path := range []struct {
		name     string
		protocol sim.Protocol
	}{{"tunnel", sim.ProtocolOpenAI}, {"normalized", sim.ProtocolOllama}} {
		t.Run(path.name, func(t *testing.T) {
			st := startPrefixStack(t, path.protocol, 1)
			for _, api := range prefixAPIs {
				for _, alias := range []string{"pool", "pool-ll"} {
					t.Run(api.name+"/"+alias, func(t *testing.T) {
						c := newConversation(path.name + " " + api.name + " " + alias)
						c.ask("What is a prefix cache?")
						onA, stopA := st.block(t, "pool", []chatMessage{{"user", "blocker one " + api.name + alias}})
						onB, stopB := st.block(t, "pool", []chatMessage{{"user", "blocker two " + api.name + alias}})
						if onA != "a" || onB != "b" {
							t.Fatalf("blockers on %s and %s: with no prefix match, least-loaded chooses a then b", onA, onB)
						}
						if first := st.servedBy(t, func() { st.send(t, api.path, api.body(alias, c)) }); first != "c" {
							t.Fatalf("first turn on %s, want c (the only free provider)", first)
						}
						stopA()
						stopB()
						waitIdle(t, st.e)
						c.answer("It keeps the keys and values of a prompt it has seen.")
						c.ask("Why does routing matter for it?")
						before := st.hits()
						second := st.servedBy(t, func() { st.send(t, api.path, api.body(alias, c)) })
						want := "c"
						if alias == "pool-ll" {
							want = "a"
						}
						if second != want {
							t.Fatalf("second turn on %s, want %s", second, want)
						}
						if hit := st.hits()[second] - before[second]; alias == "pool" && hit < 100 {
							t.Fatalf("second turn hit %d tokens of c's cache, want its first turn's prompt (over 100 tokens)", hit)
						}
					})
				}
			}
		})
	}
}

// TestPrefixRoutingIsWorkConserving: when the provider holding
// a conversation's prefix is full, its next turn goes at once to a free
// provider (the least loaded one: a), never waiting for the busy one.
func TestPrefixRoutingIsWorkConserving(t *testing.T) {
	harness.Parallel(t)
	st := startPrefixStack(t, sim.ProtocolOpenAI, 1)
	c := newConversation("work conservation")
	c.ask("First question?")
	_, stopA := st.block(t, "pool", []chatMessage{{"user", "unrelated one"}})
	_, stopB := st.block(t, "pool", []chatMessage{{"user", "unrelated two"}})
	if first := st.servedBy(t, func() { st.send(t, "/v1/chat/completions", prefixAPIs[0].body("pool", c)) }); first != "c" {
		t.Fatalf("first turn on %s, want c", first)
	}
	stopA()
	stopB()
	waitIdle(t, st.e)
	// The conversation's own long answer holds c: it goes there by prefix.
	on, stop := st.block(t, "pool", c.messages())
	defer stop()
	if on != "c" {
		t.Fatalf("a request with c's prefix went to %s", on)
	}
	c.answer("An answer.")
	c.ask("Second question?")
	if second := st.servedBy(t, func() { st.send(t, "/v1/chat/completions", prefixAPIs[0].body("pool", c)) }); second != "a" {
		t.Fatalf("with c full, the second turn went to %s, want a (free, least loaded)", second)
	}
	if w := st.e.Service.Snapshot().Waiters; w != 0 {
		t.Fatalf("%d waiters", w)
	}
	// The router's prediction is on /metrics: every prompt's blocks, and
	// of them what it expected the chosen provider to hold (the second
	// turn's first turn at least, on c; none for the blockers).
	fams := scrape(t, st.e)
	prompt, ok1 := metricValue(fams, "iop_prefix_prompt_tokens_total", "model=pool")
	predicted, ok2 := metricValue(fams, "iop_prefix_predicted_tokens_total", "model=pool")
	if !ok1 || !ok2 || predicted <= 0 || predicted >= prompt {
		t.Fatalf("iop_prefix_prompt_tokens_total %v (%v), iop_prefix_predicted_tokens_total %v (%v)", prompt, ok1, predicted, ok2)
	}
}

// TestPrefixRoutingCapacityUnderConcurrency: many
// conversations sharing a system prompt, each growing over turns, sent at
// once through prefix routing: every request is answered, no simulator
// ever sees more than its capacity or answers 429, and the caches hit.
func TestPrefixRoutingCapacityUnderConcurrency(t *testing.T) {
	harness.Parallel(t)
	const capacity, sessions, turns = 2, 12, 3
	st := startPrefixStack(t, sim.ProtocolOpenAI, capacity)
	shared := strings.Repeat("Shared system prompt for every session. ", 30)
	var wg sync.WaitGroup
	errs := make(chan error, sessions*turns)
	for i := range sessions {
		wg.Go(func() {
			c := &conversation{system: shared}
			for turn := range turns {
				c.ask(fmt.Sprintf("session %d question %d", i, turn))
				raw, _ := json.Marshal(prefixAPIs[0].body("pool", c))
				resp, err := http.Post("http://"+st.e.HTTPAddr+"/v1/chat/completions", "application/json", strings.NewReader(string(raw)))
				if err != nil {
					errs <- err
					return
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("session %d turn %d: %d %s", i, turn, resp.StatusCode, data)
					return
				}
				c.answer(fmt.Sprintf("answer %d", turn))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var hits int64
	for id, s := range st.sims {
		x := s.Stats()
		if x.MaxInFlight > capacity || x.Rejected != 0 {
			t.Errorf("sim %s: max in flight %d (capacity %d), %d rejected", id, x.MaxInFlight, capacity, x.Rejected)
		}
		hits += x.PrefixHitTokens
	}
	if hits == 0 {
		t.Error("no cache hit at all")
	}
	waitIdle(t, st.e)
}
