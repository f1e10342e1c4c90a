package e2e

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// stoppedCh returns a channel closed once p has stopped (p.Wait returned).
func stoppedCh(p *process.Process) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		_ = p.Wait()
		close(ch)
	}()
	return ch
}

// waitDone waits, bounded by testenv.WaitDeadline, until p has stopped and
// returns Wait's error.
func waitDone(t *testing.T, p *process.Process) error {
	t.Helper()
	select {
	case <-stoppedCh(p):
		return p.Wait()
	case <-time.After(testenv.WaitDeadline):
		t.Fatalf("the %s process did not stop", p.Mode)
		return nil
	}
}

// stopped reports whether p has stopped already (given a moment for the
// watcher goroutine to see it).
func stopped(p *process.Process) bool {
	select {
	case <-stoppedCh(p):
		return true
	case <-time.After(10 * time.Millisecond):
		return false
	}
}

// startNodeMode starts ModeNode for one Ollama-protocol sim provider
// "p" serving "m" at url, and waits until it is connected.
func startNodeMode(t *testing.T, e *process.Process, url string, drainTimeout time.Duration, logger *slog.Logger) *process.Process {
	t.Helper()
	n, err := process.Start(context.Background(), process.Config{Mode: process.ModeNode, Version: "9.9", Node: node.Config{
		NodeID: "n1", Edge: e.NodeAddr, DrainTimeout: drainTimeout,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeSim, Protocol: string(sim.ProtocolOllama), BaseURL: url, Models: []string{"m"}, Capacity: 2}},
	}}, process.Deps{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Abort(); _ = n.Wait() })
	select {
	case <-n.Agent.Ready():
	case <-stoppedCh(n):
		t.Fatalf("node stopped before connecting: %v", n.Wait())
	case <-time.After(testenv.WaitDeadline):
		t.Fatal("node did not connect")
	}
	return n
}

// TestNodeModeDrainLetsRunsFinish: Drain on a ModeNode process (what the
// first SIGTERM does) tells the edge, lets the stream in flight finish
// whole, then the node closes its connection (the edge fences it as
// drained) and Wait returns nil.
func TestNodeModeDrainLetsRunsFinish(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 20, DefaultMaxTokens: 1000})
	ctx, cancel := context.WithCancel(context.Background())
	edgeLogs := &logRecorder{}
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	cfg.Models = map[string]edge.ModelConfig{"alias": {Targets: []string{"m"}}}
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: slog.New(edgeLogs)})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	nodeLogs := &logRecorder{}
	n := startNodeMode(t, e, url, time.Minute, slog.New(nodeLogs))

	first, done := startRequest(e, "/v1/chat/completions", chatBody("alias", true, 10))
	<-first
	n.Drain("test drain")
	r := result(t, done)
	if r.err != nil || r.status != 200 || !bytes.Contains(r.body, []byte("[DONE]")) || bytes.Contains(r.body, []byte(`"error"`)) {
		t.Fatalf("the stream in flight at the drain: %d %v %q, want it whole", r.status, r.err, r.body)
	}
	if err := waitDone(t, n); err != nil {
		t.Errorf("node: %v", err)
	}
	waitLog(t, edgeLogs, map[string]string{"msg": "node draining: its providers take no new requests", "node": "n1"})
	if fenced := waitLog(t, edgeLogs, map[string]string{"msg": "node fenced", "node": "n1"}); !strings.Contains(fenced["cause"], "drain") {
		t.Errorf("node fenced line %v, want a cause that says it drained", fenced)
	}
	waitLog(t, nodeLogs, map[string]string{"msg": "node stopping: draining; a second signal stops it at once", "signal": "test drain"})
	if got := nodeLogs.find(map[string]string{"msg": "second signal: the runs still in flight were aborted"}); len(got) != 0 {
		t.Errorf("a drain logged an abort: %v", got)
	}
}

// TestNodeModeAbortEndsRunsAtOnce: Abort after Drain (what the second
// signal does) ends the node's run in flight, long before its drain
// timeout: the client's stream ends with an error event, and the node
// says it aborted.
func TestNodeModeAbortEndsRunsAtOnce(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 20, DefaultMaxTokens: 100_000})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"alias": {Targets: []string{"m"}}}))
	t.Cleanup(cancel)
	nodeLogs := &logRecorder{}
	n := startNodeMode(t, e, url, time.Hour, slog.New(nodeLogs))

	first, done := startRequest(e, "/v1/chat/completions", chatBody("alias", true, 100_000))
	<-first
	n.Drain("SIGTERM")
	if stopped(n) {
		t.Fatal("the node stopped at Drain with a run in flight and an hour of drain timeout")
	}
	n.Abort()
	checkStreamFailed(t, result(t, done).body)
	_ = waitDone(t, n)
	waitLog(t, nodeLogs, map[string]string{"msg": "second signal: the runs still in flight were aborted", "node_id": "n1"})
	waitIdle(t, e)
}

// TestEdgeModeAbortCutsTheDrainShort: an edge draining with an hour of
// drain timeout waits for its stream in flight; Abort then ends it at once
// with the answer the drain timeout would give (an error event, never a
// cut connection) and the edge stops, Wait nil.
func TestEdgeModeAbortCutsTheDrainShort(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 20, DefaultMaxTokens: 100_000})
	logs := &logRecorder{}
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	cfg.DrainTimeout = time.Hour
	cfg.Models = map[string]edge.ModelConfig{"alias": {Targets: []string{"m"}}}
	e, err := process.Start(context.Background(), process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Abort(); _ = e.Wait() })
	nodeCtx, stopNode := context.WithCancel(context.Background())
	harness.Node(t, nodeCtx, node.Config{NodeID: "n1", Edge: e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 1}}})
	t.Cleanup(stopNode)

	first, done := startRequest(e, "/v1/chat/completions", chatBody("alias", true, 100_000))
	<-first
	e.Drain("")
	waitLog(t, logs, map[string]string{"msg": "edge shutting down: draining requests in flight; a second signal stops it at once"})
	if stopped(e) {
		t.Fatal("the edge stopped with a stream in flight and an hour of drain timeout")
	}
	select {
	case r := <-done:
		t.Fatalf("the drain ended the stream in flight: %q", r.body)
	default:
	}
	e.Abort()
	checkStreamFailed(t, result(t, done).body)
	if err := waitDone(t, e); err != nil {
		t.Errorf("edge: %v", err)
	}
	waitLog(t, logs, map[string]string{"msg": "drain cut short (a second signal): ending the requests still in flight"})
}
