package e2e

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/scheduler"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// Nodes on several edges: one node, several real edges (each
// an in-process edge on real TCP), real gRPC, an iop sim backend whose
// own max_in_flight judges the capacity.

// severalEdgesModels is every edge's model map: alias -> the sim's "m".
var severalEdgesModels = map[string]edge.ModelConfig{"alias": {Targets: []string{"m"}}}

// startEdgeAt starts an edge whose node endpoint listens on nodeListen
// (HTTP on an ephemeral loopback port); stop ends it and waits.
func startEdgeAt(t *testing.T, nodeListen string) (e *process.Process, stop func()) {
	t.Helper()
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen = "127.0.0.1:0", nodeListen
	cfg.Database = ":memory:"
	cfg.Models = severalEdgesModels
	ctx, cancel := context.WithCancel(context.Background())
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := e.Wait(); err != nil {
				t.Errorf("edge %s: %v", nodeListen, err)
			}
		})
	}
	t.Cleanup(stop)
	return e, stop
}

// startSeveralEdgesNode runs a node agent with cfg (one sim provider "p"
// of capacity 2 serving "m" at url is added) and returns it; it stops
// with the test.
func startSeveralEdgesNode(t *testing.T, cfg node.Config, url string, logger *slog.Logger, opts ...node.Option) *node.Agent {
	t.Helper()
	cfg.NodeID = "n1"
	cfg.ReconnectMin, cfg.ReconnectMax = 50*time.Millisecond, 500*time.Millisecond
	cfg.Providers = []node.ProviderConfig{{ID: "p", Type: node.TypeSim, Protocol: string(sim.ProtocolOllama), BaseURL: url, Models: []string{"m"}, Capacity: 2}}
	if logger == nil {
		logger = harness.Logger(t, "edge")
	}
	a, err := node.New(cfg, logger, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("node Run: %v", err)
			}
		case <-time.After(testenv.WaitDeadline):
			t.Error("node Run did not return")
		}
	})
	return a
}

// welcomedBy waits until e lists node n1 with provider p, and returns its
// generation there.
func welcomedBy(t *testing.T, e *process.Process) uint64 {
	t.Helper()
	var gen uint64
	testenv.Eventually(t, "node n1 on the edge at "+e.NodeAddr, func() bool {
		snap := e.Service.Snapshot()
		for _, n := range snap.Nodes {
			if n.NodeID == "n1" && len(n.Providers) == 1 && !n.Draining && providerAvailable(snap, n.NodeID, n.Generation) {
				gen = n.Generation
				return true
			}
		}
		return false
	})
	return gen
}

// providerAvailable reports whether the scheduler holds a provider of
// node id at generation gen taking requests. The node is in the snapshot's
// Nodes from its hello, a moment before its providers are activated: a
// request in between is refused (TestNodeResolvesEdgesName failed so once).
func providerAvailable(snap contract.Snapshot, id string, gen uint64) bool {
	for _, p := range snap.Providers {
		if p.NodeID == id && p.Generation == gen && p.Status == scheduler.StatusAvailable {
			return true
		}
	}
	return false
}

// postChat sends a non-streamed chat through e and returns status and body.
func postChat(e *process.Process, maxTokens int) (int, []byte, error) {
	resp, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("alias", false, maxTokens)))
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

// TestNodeOnSeveralEdges: a node given three edges (edges:, plus edge:
// as one more) connects to each, with a generation per edge; a run
// dispatched by each edge is answered.
func TestNodeOnSeveralEdges(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}})
	e1, _ := startEdgeAt(t, "127.0.0.1:0")
	e2, _ := startEdgeAt(t, "127.0.0.1:0")
	e3, _ := startEdgeAt(t, "127.0.0.1:0")
	a := startSeveralEdgesNode(t, node.Config{Edge: e1.NodeAddr, Edges: []string{e2.NodeAddr, e3.NodeAddr}}, url, nil)
	for _, e := range []*process.Process{e1, e2, e3} {
		welcomedBy(t, e)
	}
	testenv.Eventually(t, "three welcomed connections", func() bool { return len(a.Generations()) == 3 })
	for addr, g := range a.Generations() {
		if g == 0 {
			t.Errorf("connection to %s: generation 0", addr)
		}
	}
	for _, e := range []*process.Process{e1, e2, e3} {
		status, body, err := postChat(e, 5)
		if err != nil || status != http.StatusOK || !bytes.Contains(body, []byte(`"choices"`)) {
			t.Errorf("chat through the edge at %s: %d %v %s", e.HTTPAddr, status, err, body)
		}
	}
	for _, e := range []*process.Process{e1, e2, e3} {
		waitIdle(t, e)
	}
	// The node forgets a run once the edge ended its stream, just after
	// the edge's own end of it.
	testenv.Eventually(t, "no run in flight on the node", func() bool { return len(a.RunsInFlight()) == 0 })
}

// TestNodeCapacityHoldsAcrossEdges: three edges that do not count
// together each send the node up to its provider's capacity (2); the
// provider never runs more than 2 at once (the sim's max_in_flight), and
// every client is answered: completed, or refused with 503 and
// Retry-After (the node refuses what stays above capacity: load, not a
// failure of the provider), never a hang, and no edge took the provider
// out of rotation for it.
func TestNodeCapacityHoldsAcrossEdges(t *testing.T) {
	harness.Parallel(t)
	s, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 200})
	var edges []*process.Process
	var addrs []string
	for range 3 {
		e, _ := startEdgeAt(t, "127.0.0.1:0")
		edges = append(edges, e)
		addrs = append(addrs, e.NodeAddr)
	}
	a := startSeveralEdgesNode(t, node.Config{Edges: addrs}, url, nil)
	for _, e := range edges {
		welcomedBy(t, e)
	}
	const perEdge = 6
	type answer struct {
		status     int
		retryAfter string
		body       []byte
		err        error
	}
	answers := make(chan answer, perEdge*len(edges))
	var wg sync.WaitGroup
	for _, e := range edges {
		for range perEdge {
			wg.Go(func() {
				resp, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("alias", false, 20)))
				if err != nil {
					answers <- answer{err: err}
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After"), body, err}
			})
		}
	}
	wg.Wait()
	close(answers)
	ok := 0
	for r := range answers {
		switch {
		case r.err != nil:
			t.Errorf("client: %v", r.err)
		case r.status == http.StatusOK:
			ok++
		case r.status != http.StatusServiceUnavailable || r.retryAfter == "":
			t.Errorf("client: %d (Retry-After %q) %s, want 200 or 503 with Retry-After", r.status, r.retryAfter, r.body)
		}
	}
	if ok == 0 {
		t.Error("no request completed")
	}
	if st := s.Stats(); st.MaxInFlight > 2 {
		t.Errorf("the provider ran %d at once, capacity 2", st.MaxInFlight)
	}
	for i, e := range edges {
		waitIdle(t, e)
		if n := e.Service.Stats().CircuitOpened; n != 0 {
			t.Errorf("edge %d opened the provider's circuit %d times for the node's capacity refusals", i+1, n)
		}
	}
	testenv.Eventually(t, "no run in flight on the node", func() bool { return len(a.RunsInFlight()) == 0 })
}

// TestNodeEdgeRestartLeavesOtherEdgesAlone: with streams in flight
// through two edges, a third edge stops and starts again on the same
// address: the two streams end whole, the node keeps its connections to
// the two others (same generations) and connects to the restarted edge
// again.
func TestNodeEdgeRestartLeavesOtherEdgesAlone(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 50, DefaultMaxTokens: 1000})
	e1, stop1 := startEdgeAt(t, "127.0.0.1:0")
	e2, _ := startEdgeAt(t, "127.0.0.1:0")
	e3, _ := startEdgeAt(t, "127.0.0.1:0")
	a := startSeveralEdgesNode(t, node.Config{Edges: []string{e1.NodeAddr, e2.NodeAddr, e3.NodeAddr}}, url, nil)
	welcomedBy(t, e1)
	g2, g3 := welcomedBy(t, e2), welcomedBy(t, e3)

	first2, done2 := startRequest(e2, "/v1/chat/completions", chatBody("alias", true, 40))
	first3, done3 := startRequest(e3, "/v1/chat/completions", chatBody("alias", true, 40))
	<-first2
	<-first3
	stop1()
	again, _ := startEdgeAt(t, e1.NodeAddr)
	welcomedBy(t, again)

	for name, done := range map[string]<-chan streamResult{"edge 2": done2, "edge 3": done3} {
		r := result(t, done)
		if r.err != nil || r.status != http.StatusOK || !bytes.Contains(r.body, []byte("[DONE]")) || bytes.Contains(r.body, []byte(`"error"`)) {
			t.Errorf("stream through %s while edge 1 restarted: %d %v %q, want it whole", name, r.status, r.err, r.body)
		}
	}
	if got := a.Generations(); got[e2.NodeAddr] != g2 || got[e3.NodeAddr] != g3 {
		t.Errorf("generations on edges 2 and 3: %v, want %d and %d unchanged", got, g2, g3)
	}
	// The node's registration is in the snapshot a moment before its
	// providers are in the model catalog requests resolve against.
	testenv.Eventually(t, "a chat through the restarted edge", func() bool {
		status, _, err := postChat(again, 5)
		return err == nil && status == http.StatusOK
	})
}

// TestNodeDrainDrainsEveryEdge: Drain tells every edge (each lists the
// node draining) and lets a stream in flight through one of them end
// whole; then Run returns.
func TestNodeDrainDrainsEveryEdge(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 50, DefaultMaxTokens: 1000})
	e1, _ := startEdgeAt(t, "127.0.0.1:0")
	e2, _ := startEdgeAt(t, "127.0.0.1:0")
	cfg := node.Config{NodeID: "n1", Edges: []string{e1.NodeAddr, e2.NodeAddr}, DrainTimeout: time.Minute,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeSim, Protocol: string(sim.ProtocolOllama), BaseURL: url, Models: []string{"m"}, Capacity: 2}}}
	a, err := node.New(cfg, harness.Logger(t, "node"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	welcomedBy(t, e1)
	welcomedBy(t, e2)
	first, answer := startRequest(e2, "/v1/chat/completions", chatBody("alias", true, 40))
	<-first
	a.Drain("test drain")
	r := result(t, answer)
	if r.err != nil || r.status != http.StatusOK || !bytes.Contains(r.body, []byte("[DONE]")) || bytes.Contains(r.body, []byte(`"error"`)) {
		t.Errorf("the stream in flight at the drain: %d %v %q, want it whole", r.status, r.err, r.body)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after the drain: %v", err)
		}
	case <-time.After(testenv.WaitDeadline):
		t.Fatal("Run did not return after the drain")
	}
	for _, e := range []*process.Process{e1, e2} {
		testenv.Eventually(t, "the node gone from the edge at "+e.NodeAddr, func() bool { return nodeGeneration(e.Service.Snapshot(), "n1") == 0 })
	}
}

// dnsServer is a tiny DNS server on UDP for one name: A queries get the
// addresses set last, AAAA and others an empty answer.
type dnsServer struct {
	pc   net.PacketConn
	name dnsmessage.Name

	mu    sync.Mutex
	addrs []netip.Addr
}

func startDNS(t *testing.T, name string, addrs ...netip.Addr) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{pc: pc, name: dnsmessage.MustNewName(name + "."), addrs: addrs}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := d.answer(buf[:n]); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return d
}

func (d *dnsServer) set(addrs ...netip.Addr) {
	d.mu.Lock()
	d.addrs = addrs
	d.mu.Unlock()
}

func (d *dnsServer) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !strings.EqualFold(q.Name.String(), d.name.String()) {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if rh.RCode == dnsmessage.RCodeSuccess && q.Type == dnsmessage.TypeA {
		d.mu.Lock()
		for _, a := range d.addrs {
			_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: a.As4()})
		}
		d.mu.Unlock()
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// resolver is a net.Resolver (Go's own) that asks d.
func (d *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "udp", d.pc.LocalAddr().String())
	}}
}

// TestNodeResolvesEdgesName: edges: [a name] whose DNS answer holds three
// A records (three edges on 127.0.0.1, .2 and .3, one port) connects the
// node to each; the name looked up again without one address drains and
// closes that connection (the edge sees the node drain, then go), and
// with it back connects again. The lookups go through Go's resolver to a
// DNS server of the test.
func TestNodeResolvesEdgesName(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}})
	e1, _ := startEdgeAt(t, "127.0.0.1:0")
	_, port, _ := net.SplitHostPort(e1.NodeAddr)
	e2, _ := startEdgeAt(t, "127.0.0.2:"+port)
	e3, _ := startEdgeAt(t, "127.0.0.3:"+port)
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	dns := startDNS(t, "edges.iop.test", ip("127.0.0.1"), ip("127.0.0.2"), ip("127.0.0.3"))
	logs := &logRecorder{}
	a := startSeveralEdgesNode(t, node.Config{Edges: []string{"edges.iop.test:" + port}, ResolveInterval: 20 * time.Millisecond}, url,
		slog.New(logs), node.WithResolver(dns.resolver()))
	for _, e := range []*process.Process{e1, e2, e3} {
		welcomedBy(t, e)
	}
	for _, e := range []*process.Process{e1, e2, e3} {
		status, body, err := postChat(e, 5)
		if err != nil || status != http.StatusOK {
			t.Errorf("chat through the edge at %s: %d %v %s", e.NodeAddr, status, err, body)
		}
	}
	g1, g2 := a.Generations()[e1.NodeAddr], a.Generations()[e2.NodeAddr]

	dns.set(ip("127.0.0.1"), ip("127.0.0.2"))
	testenv.Eventually(t, "the node gone from the edge whose address went", func() bool { return nodeGeneration(e3.Service.Snapshot(), "n1") == 0 })
	waitLog(t, logs, map[string]string{"msg": "edge address gone: draining its connection", "edge": e3.NodeAddr})
	waitLog(t, logs, map[string]string{"msg": "draining: the edge is told, no more dispatches are taken, the runs in flight may finish", "edge": e3.NodeAddr, "reason": node.ErrEdgeGone.Error()})
	// The node's side of the closed connection ends just after the edge's.
	testenv.Eventually(t, "two connections left", func() bool { return len(a.Generations()) == 2 })
	if got := a.Generations(); got[e1.NodeAddr] != g1 || got[e2.NodeAddr] != g2 {
		t.Errorf("generations after the address went: %v, want edges 1 and 2 unchanged (%d, %d)", got, g1, g2)
	}

	dns.set(ip("127.0.0.1"), ip("127.0.0.2"), ip("127.0.0.3"))
	welcomedBy(t, e3)
	status, body, err := postChat(e3, 5)
	if err != nil || status != http.StatusOK {
		t.Errorf("chat through the edge whose address came back: %d %v %s", status, err, body)
	}
	testenv.Eventually(t, "three welcomed connections again", func() bool { return len(a.Generations()) == 3 })
}

// Regression (one node on several edges; the fix is DispatchRefused.busy,
// commit 27f8753, its unit tests TestRegression_BusyRefusalIsNoProviderFailure
// and TestProviderBusyIs503WithRetryAfter in package edge; this is the same
// with real processes' pieces): three edges that do not count together send
// the node more long answers (about 3 s each) than its provider takes (2),
// so the node refuses those that wait 1 s for a slot. Each refusal counted
// as a failure of the provider at its edge: three in a row opened the
// provider's circuit there (CircuitOpened 1, the healthy provider out of
// rotation for 30 s), and refused clients got 502 "The node serving this
// request failed". A refusal for capacity is load: 503 with Retry-After,
// and every circuit stays closed.
func TestRegression_NodeCapacityRefusalsKeepCircuitsClosed(t *testing.T) {
	harness.Parallel(t)
	s, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 20})
	var edges []*process.Process
	var addrs []string
	for range 3 {
		e, _ := startEdgeAt(t, "127.0.0.1:0")
		edges = append(edges, e)
		addrs = append(addrs, e.NodeAddr)
	}
	startSeveralEdgesNode(t, node.Config{Edges: addrs}, url, nil)
	for _, e := range edges {
		welcomedBy(t, e)
	}
	var mu sync.Mutex
	ok, refused := 0, 0
	var wg sync.WaitGroup
	for _, e := range edges {
		for range 6 {
			wg.Go(func() {
				resp, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("alias", false, 60)))
				if err != nil {
					t.Errorf("client: %v", err)
					return
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && resp.StatusCode == http.StatusOK:
					ok++
				case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "":
					refused++
				default:
					t.Errorf("client: %d (Retry-After %q) %s (read: %v), want 200 or 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body, err)
				}
			})
		}
	}
	wg.Wait()
	t.Logf("completed %d, refused %d; peak in flight %d", ok, refused, s.Stats().MaxInFlight)
	if ok == 0 || refused < 3 {
		t.Fatalf("completed %d, refused %d: want some of each (at least 3 refusals, as many as open a circuit)", ok, refused)
	}
	if got := s.Stats().MaxInFlight; got > 2 {
		t.Errorf("the provider ran %d at once, capacity 2", got)
	}
	for i, e := range edges {
		waitIdle(t, e)
		if n := e.Service.Stats().CircuitOpened; n != 0 {
			t.Errorf("edge %d opened the provider's circuit %d times for the node's capacity refusals", i+1, n)
		}
		for _, p := range e.Service.Snapshot().Providers {
			if p.Circuit != edge.CircuitClosed {
				t.Errorf("edge %d: provider %s circuit %s, want closed", i+1, p.ProviderID, p.Circuit)
			}
		}
	}
}
