package node

import (
	"context"
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"iop/internal/sim"
	"iop/internal/wire/nodev1"
)

// Tests of discovery: a provider without models serves what its server
// lists, re-read on the agent's clock, and the edge hears of every change,
// and of nothing else.

// discoverySim is a simulated model server a test can take down and bring
// back on the same address.
type discoverySim struct {
	*sim.Server
	url  string
	stop func()
}

func startDiscoverySim(t *testing.T, cfg sim.Config) *discoverySim {
	t.Helper()
	s, err := sim.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	u, stop, err := s.Start("")
	if err != nil {
		t.Fatal(err)
	}
	d := &discoverySim{Server: s, url: u, stop: stop}
	t.Cleanup(func() { d.down() })
	return d
}

// down stops the server: it refuses connections.
func (d *discoverySim) down() {
	if d.stop != nil {
		d.stop()
		d.stop = nil
	}
}

// up starts the server again on its address.
func (d *discoverySim) up(t *testing.T) {
	t.Helper()
	u, _ := url.Parse(d.url)
	again, stop, err := d.Start(u.Host)
	if err != nil {
		t.Fatalf("restarting the sim on %s: %v", u.Host, err)
	}
	if again != d.url {
		t.Fatalf("restarted at %s, want %s", again, d.url)
	}
	d.stop = stop
}

// round is one finished discovery round.
type round struct {
	provider string
	changed  bool
}

// startDiscoveringAgent runs an agent for cfg on clk that reports its
// discovery rounds on the returned channel.
func startDiscoveringAgent(t *testing.T, cfg Config, clk *testClock) (*Agent, <-chan round) {
	t.Helper()
	rounds := make(chan round, 64)
	a := startAgentWith(t, cfg, clk, nil, func(a *Agent) {
		a.afterRound = func(id string, changed bool) { rounds <- round{id, changed} }
	})
	return a, rounds
}

// nextRound advances clk by one discovery interval d, once the agent waits
// for it, and returns the round that ran.
func nextRound(t *testing.T, clk *testClock, rounds <-chan round, d time.Duration) round {
	t.Helper()
	clk.waitArmed(t, d)
	clk.Advance(d)
	return recv(t, rounds, "discovery round")
}

// advanceUntilRound advances clk by d until a discovery round runs, and
// returns it: for a discovery timer whose arming the test could not wait
// for (its report may have gone to an earlier waitArmed, or it may come
// only after the test's last Advance when the machine is slow).
func advanceUntilRound(t *testing.T, clk *testClock, rounds <-chan round, d time.Duration) round {
	t.Helper()
	deadline := time.After(failsafe)
	for {
		clk.Advance(d)
		select {
		case r := <-rounds:
			return r
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("timed out waiting for a discovery round")
		}
	}
}

// nextUpdate returns the node's next control message, which must be a
// ProviderUpdate.
func (c *edgeConn) nextUpdate(t *testing.T) *nodev1.ProviderUpdate {
	t.Helper()
	m := c.next(t)
	u := m.GetProviderUpdate()
	if u == nil {
		t.Fatalf("got %v, want a ProviderUpdate", m)
	}
	return u
}

// noMessage fails if the node sent anything but heartbeats that the test
// has not read.
func (c *edgeConn) noMessage(t *testing.T) {
	t.Helper()
	for {
		select {
		case m := <-c.in:
			if m.GetHeartbeat() == nil {
				t.Fatalf("unexpected message %v", m)
			}
		default:
			return
		}
	}
}

// simDetails is what the sim's /api/tags and /api/show say of every model,
// but its digest and modified_at.
var simDetails = &nodev1.ModelDetails{Size: 1 << 30, Format: "gguf", Family: "sim", Families: []string{"sim"},
	ParameterSize: "1B", QuantizationLevel: "Q4_K_M", ContextLength: 4096}

// sameDetails compares details ignoring the digest and modified_at (which
// the sim derives from the model's creation), after checking they are set.
func sameDetails(t *testing.T, got, want *nodev1.ModelDetails) bool {
	t.Helper()
	if got.GetDigest() == "" || got.GetModifiedAt() == "" {
		return false
	}
	g := proto.Clone(got).(*nodev1.ModelDetails)
	g.Digest, g.ModifiedAt = "", ""
	return proto.Equal(g, want)
}

// TestDiscoveryHelloSaysWhatTheServerServes: a provider of type ollama with
// a base_url alone serves every model its /api/tags lists, each with the
// capabilities its /api/show says (in iop's words: embedding is
// embeddings) and the details of both; it is healthy.
func TestDiscoveryHelloSaysWhatTheServerServes(t *testing.T) {
	s := startDiscoverySim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"qwen3:latest", "embed:latest"},
		Capabilities: map[string][]string{"qwen3:latest": {"completion", "tools", "thinking"}, "embed:latest": {"embedding"}}})
	e, addr := startEdge(t)
	startDiscoveringAgent(t, testConfig(addr, ProviderConfig{ID: "ollama", Type: TypeOllama, BaseURL: s.url}), newTestClock())
	c := recv(t, e.conns, "connection")
	if len(c.hello.Providers) != 1 {
		t.Fatalf("hello %v", c.hello)
	}
	p := c.hello.Providers[0]
	if !p.Healthy || !slices.Equal(p.Models, []string{"embed:latest", "qwen3:latest"}) || !slices.Equal(p.Capabilities, []string{"stream"}) ||
		p.ExecutionPath != normalized || len(p.ModelCapabilities) != 2 {
		t.Fatalf("provider %v", p)
	}
	embed, qwen := p.ModelCapabilities[0], p.ModelCapabilities[1]
	if embed.Model != "embed:latest" || !slices.Equal(embed.Capabilities, []string{"stream", "embeddings"}) {
		t.Errorf("embed entry %v", embed)
	}
	if qwen.Model != "qwen3:latest" || !slices.Equal(qwen.Capabilities, []string{"stream", "completion", "tools", "thinking"}) {
		t.Errorf("qwen3 entry %v", qwen)
	}
	for _, m := range p.ModelCapabilities {
		if !sameDetails(t, m.Details, simDetails) {
			t.Errorf("%s details %v", m.Model, m.Details)
		}
	}
}

// TestDiscoverySendsUpdatesExactlyWhenSomethingChanged: every interval of
// the agent's clock the node reads its server again; it sends a
// ProviderUpdate (models_set, the whole model list) when a model was pulled
// or removed, when the server stops answering (unhealthy, the models last
// read kept) and when it answers again, and nothing when a round found
// what the edge already knows.
func TestDiscoverySendsUpdatesExactlyWhenSomethingChanged(t *testing.T) {
	const interval = 7 * time.Second
	s := startDiscoverySim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"a:latest"}})
	e, addr := startEdge(t)
	clk := newTestClock()
	cfg := testConfig(addr, ProviderConfig{ID: "ollama", Type: TypeOllama, BaseURL: s.url})
	cfg.DiscoveryInterval = interval
	a, rounds := startDiscoveringAgent(t, cfg, clk)
	if r := recv(t, rounds, "first round"); !r.changed {
		t.Fatalf("first round %+v, want changed", r)
	}
	c := connect(t, e, 1, hour)
	waitGeneration(t, a, 1) // welcomed: the hello timeout no longer runs on the clock
	if !slices.Equal(c.hello.Providers[0].Models, []string{"a:latest"}) {
		t.Fatalf("hello %v", c.hello)
	}

	unchanged := func(what string) {
		t.Helper()
		if r := nextRound(t, clk, rounds, interval); r.changed {
			t.Fatalf("%s: round %+v changed the advert", what, r)
		}
		c.noMessage(t)
	}
	expect := func(what string, healthy bool, models ...string) *nodev1.ProviderUpdate {
		t.Helper()
		if r := nextRound(t, clk, rounds, interval); !r.changed || r.provider != "ollama" {
			t.Fatalf("%s: round %+v, want a change", what, r)
		}
		u := c.nextUpdate(t)
		if u.ProviderId != "ollama" || u.Healthy != healthy || !u.ModelsSet || !slices.Equal(u.Models, models) ||
			u.Capacity != 0 || u.LongCapacity != 0 {
			t.Fatalf("%s: update %v, want healthy %v with models %v", what, u, healthy, models)
		}
		c.noMessage(t)
		return u
	}

	unchanged("nothing happened")
	s.AddModel("b:7b", "completion", "tools")
	u := expect("b:7b pulled", true, "a:latest", "b:7b")
	if i := slices.IndexFunc(u.ModelCapabilities, func(m *nodev1.ModelCapabilities) bool { return m.Model == "b:7b" }); i < 0 ||
		!slices.Equal(u.ModelCapabilities[i].Capabilities, []string{"stream", "completion", "tools"}) {
		t.Fatalf("capabilities of b:7b in %v", u.ModelCapabilities)
	}
	unchanged("nothing happened again")
	s.RemoveModel("a:latest")
	expect("a removed", true, "b:7b")
	s.AddModel("b:7b", "completion", "tools")
	u = expect("b:7b pulled again (new digest)", true, "b:7b")
	if d := u.ModelCapabilities[0].Details; d.GetModifiedAt() == "" || d.GetDigest() == "" {
		t.Fatalf("details %v", d)
	}

	s.down()
	expect("server down", false, "b:7b")
	unchanged("still down")
	s.up(t)
	expect("server back", true, "b:7b")
	unchanged("up")

	s.RemoveModel("b:7b")
	expect("last model removed", false)
	s.AddModel("c")
	expect("a model again", true, "c")
}

// TestDiscoveryServerDownAtStart: a provider whose server does not answer
// when the node starts is advertised unhealthy with no models; once the
// server answers, an update brings its models.
func TestDiscoveryServerDownAtStart(t *testing.T) {
	const interval = 5 * time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s, err := sim.New(sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"late:latest"}}, nil)
	if err != nil {
		t.Fatal(err)
	}

	e, edgeAddr := startEdge(t)
	clk := newTestClock()
	cfg := testConfig(edgeAddr, ProviderConfig{ID: "ollama", Type: TypeOllama, BaseURL: "http://" + addr, DiscoveryInterval: interval})
	a, rounds := startDiscoveringAgent(t, cfg, clk)
	if r := recv(t, rounds, "first round"); r.changed {
		t.Fatalf("first round with the server down changed the advert: %+v", r)
	}
	c := connect(t, e, 1, hour)
	waitGeneration(t, a, 1)
	want := &nodev1.Provider{Id: "ollama", Type: TypeOllama, Models: []string{}, Capacity: 1, LongCapacity: 1,
		Capabilities: []string{"stream"}, ExecutionPath: normalized}
	if got := c.hello.Providers[0]; !proto.Equal(got, want) {
		t.Fatalf("hello provider %v, want %v", got, want)
	}

	if _, stop, err := s.Start(addr); err != nil {
		t.Fatalf("starting the sim on %s: %v", addr, err)
	} else {
		t.Cleanup(stop)
	}
	if r := nextRound(t, clk, rounds, interval); !r.changed {
		t.Fatalf("round after the server came up: %+v", r)
	}
	if u := c.nextUpdate(t); !u.Healthy || !u.ModelsSet || !slices.Equal(u.Models, []string{"late:latest"}) {
		t.Fatalf("update %v", u)
	}
}

// TestDiscoveryHelloAfterReconnect: a new connection says hello with what
// is known then and replays no update the edge had before.
func TestDiscoveryHelloAfterReconnect(t *testing.T) {
	const interval = 5 * time.Second
	s := startDiscoverySim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"a"}})
	e, addr := startEdge(t)
	clk := newTestClock()
	cfg := testConfig(addr, ProviderConfig{ID: "ollama", Type: TypeOllama, BaseURL: s.url, DiscoveryInterval: interval})
	a, rounds := startDiscoveringAgent(t, cfg, clk)
	recv(t, rounds, "first round")
	c1 := connect(t, e, 1, hour)
	waitGeneration(t, a, 1)
	s.AddModel("b")
	if r := nextRound(t, clk, rounds, interval); !r.changed {
		t.Fatalf("round %+v", r)
	}
	if u := c1.nextUpdate(t); !slices.Equal(u.Models, []string{"a", "b"}) {
		t.Fatalf("update %v", u)
	}

	c1.end <- nil // the edge ends the connection
	recv(t, c1.done, "first connection to end")
	// The discovery timer, armed after the round, has not fired: the backoff
	// (3s) is shorter than the interval.
	clk.waitArmed(t, cfg.ReconnectMin)
	clk.Advance(cfg.ReconnectMin)
	c2 := connect(t, e, 2, hour)
	waitGeneration(t, a, 2)
	if got := c2.hello.Providers[0].Models; !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("hello after reconnect: models %v", got)
	}
	s.RemoveModel("a")
	if r := advanceUntilRound(t, clk, rounds, interval); !r.changed {
		t.Fatalf("round %+v", r)
	}
	if u := c2.nextUpdate(t); !slices.Equal(u.Models, []string{"b"}) {
		t.Fatalf("first update on the new connection %v, want models [b] only", u)
	}
}

// TestDiscoveryConfiguredCapabilitiesOverride: a discovered provider that
// configures capabilities gives every model those (and completion), not
// what the server says; its models still carry their details.
func TestDiscoveryConfiguredCapabilitiesOverride(t *testing.T) {
	s := startDiscoverySim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"e"}, Capabilities: map[string][]string{"e": {"embedding"}}})
	e, addr := startEdge(t)
	startDiscoveringAgent(t, testConfig(addr, ProviderConfig{ID: "o", Type: TypeOllama, BaseURL: s.url, Capabilities: []string{"tools"}}), newTestClock())
	p := recv(t, e.conns, "connection").hello.Providers[0]
	if len(p.ModelCapabilities) != 1 || !slices.Equal(p.ModelCapabilities[0].Capabilities, []string{"stream", "tools", "completion"}) ||
		p.ModelCapabilities[0].Details == nil {
		t.Fatalf("provider %v", p)
	}
}

// TestDiscoveryOpenAICompatible: a provider of type openai (or vllm) with a
// base_url alone serves every model of its GET {base_url}/models, with the
// provider's capabilities.
func TestDiscoveryOpenAICompatible(t *testing.T) {
	s := startDiscoverySim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"Qwen/Qwen3-8B", "meta/llama"}})
	e, addr := startEdge(t)
	startDiscoveringAgent(t, testConfig(addr, ProviderConfig{ID: "vllm", Type: TypeVLLM, BaseURL: s.url + "/v1", Capabilities: []string{"tools"}}), newTestClock())
	p := recv(t, e.conns, "connection").hello.Providers[0]
	if !p.Healthy || !slices.Equal(p.Models, []string{"Qwen/Qwen3-8B", "meta/llama"}) || p.ExecutionPath != tunnel ||
		!slices.Equal(p.Capabilities, []string{"stream", "tools"}) || len(p.ModelCapabilities) != 0 {
		t.Fatalf("provider %v", p)
	}
}

// TestDiscover: the exported one-shot read that iop dev uses.
func TestDiscover(t *testing.T) {
	s := startDiscoverySim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"z", "a"}, Capabilities: map[string][]string{"a": {"embedding"}}})
	models, err := Discover(context.Background(), ProviderConfig{ID: "o", Type: TypeOllama, BaseURL: s.url})
	if err != nil {
		t.Fatal(err)
	}
	if len(models) != 2 || models[0].Name != "a" || !slices.Equal(models[0].Capabilities, []string{"embeddings"}) ||
		models[1].Name != "z" || !slices.Equal(models[1].Capabilities, []string{"completion", "tools", "vision", "embeddings"}) {
		t.Fatalf("models %+v", models)
	}
	s.down()
	if _, err := Discover(context.Background(), ProviderConfig{ID: "o", Type: TypeOllama, BaseURL: s.url}); err == nil {
		t.Fatal("Discover of a stopped server: no error")
	}
	if _, err := Discover(context.Background(), ProviderConfig{ID: "c", Type: TypeCLI, Command: []string{"x"}}); err == nil {
		t.Fatal("Discover of a cli provider: no error")
	}
}
