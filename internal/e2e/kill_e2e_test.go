package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// killRig is an edge (in this process, its JSON log at debug level in log)
// and the config file of one `iop node` (capacity 1) serving model m from a
// slow simulator.
type killRig struct {
	e    *process.Process
	log  *harness.Buffer
	path string
	ctx  context.Context
}

func newKillRig(t *testing.T) *killRig {
	t.Helper()
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 20, DefaultMaxTokens: 40})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	cfg.Queue = edge.QueueConfig{MaxQueue: 32, QueueTimeout: 60 * time.Second, ReconnectGrace: 30 * time.Second}
	log := &harness.Buffer{}
	logger := slog.New(slog.NewJSONHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("edge log:\n%s", log.String())
		}
	})
	path := filepath.Join(t.TempDir(), "node.yaml")
	writeAtomically(t, path, fmt.Sprintf("node_id: n1\nedge: %s\nproviders:\n  - {id: p1, type: ollama, base_url: %q, models: [m], capacity: 1}\n", e.NodeAddr, simURL))
	return &killRig{e: e, log: log, path: path, ctx: ctx}
}

// node starts `iop node` and waits until its provider is available.
func (k *killRig) node(t *testing.T) *harness.Command {
	t.Helper()
	c := harness.StartCommand(t, k.ctx, "node", "--config", k.path, "--log-format", "json")
	waitSnapshot(t, k.e, func(s contract.Snapshot) bool {
		return len(s.Providers) == 1 && s.Providers[0].Status == "available"
	})
	return c
}

// stream sends one streaming chat request of model m asking for at most
// maxTokens tokens and reports, on the returned channel, nil for a whole
// answer or why it was not one.
func (k *killRig) stream(maxTokens int64) <-chan error {
	out := make(chan error, 1)
	client := newClient(k.e)
	go func() {
		s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "m",
			MaxTokens: openai.Int(maxTokens), Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
		defer s.Close()
		finished := false
		for s.Next() {
			for _, c := range s.Current().Choices {
				finished = finished || c.FinishReason != ""
			}
		}
		switch {
		case s.Err() != nil:
			out <- s.Err()
		case !finished:
			out <- fmt.Errorf("stream ended without a finish reason")
		default:
			out <- nil
		}
	}()
	return out
}

// TestRegression_KilledNodeKeepsEveryQueuedClient: the only node of a model
// (capacity 1) runs one stream with 8 short ones queued when it is
// killed (SIGKILL: no drain, no goodbye), then starts again; three times.
// The run in flight ends, and its slot may be handed to the first waiter
// in the instant before the edge sees the connection gone: that waiter's
// dispatch fails on the dead connection (a warm run stream's send, or a
// generation gone before the dispatch). Every queued client must still be
// held for reconnect_grace and answered 200 with a whole answer once the
// node is back; the waiter whose dispatch failed used to get 503 at once
// (about one round in ten). The edge's log says what happened: each
// queued client's request line has queue_reason "queued" and the time it
// waited, and no line says a provider is tried, a generation was
// replaced, or an error's prefix twice.
func TestRegression_KilledNodeKeepsEveryQueuedClient(t *testing.T) {
	harness.Parallel(t)
	k := newKillRig(t)
	node := k.node(t)
	for round := range 3 {
		running := k.stream(40) // 2 s at 20 tokens/s: cut by the kill
		waitSnapshot(t, k.e, func(s contract.Snapshot) bool { return len(s.Providers) == 1 && s.Providers[0].InFlight == 1 })
		var queued []<-chan error
		for range 8 {
			queued = append(queued, k.stream(2))
		}
		waitSnapshot(t, k.e, func(s contract.Snapshot) bool { return s.Waiters == 8 })

		if err := node.Cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		<-node.Done()
		waitSnapshot(t, k.e, func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
		node = k.node(t)
		for i, ch := range queued {
			select {
			case err := <-ch:
				if err != nil {
					t.Errorf("round %d: queued client %d: %v", round, i, err)
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("round %d: queued client %d not answered", round, i)
			}
		}
		select {
		case <-running: // cut by the kill (an error event), or served again if it had no byte yet
		case <-time.After(60 * time.Second):
			t.Fatalf("round %d: the client whose run the kill cut was never answered", round)
		}
	}
	if t.Failed() {
		return
	}

	// A request's line is written as its handler returns, after its
	// client read the end.
	testenv.Eventually(t, "every request line", func() bool {
		return strings.Count(k.log.String(), `"msg":"request","component":"edge-api"`) >= 3*9
	})
	completed := 0
	for _, l := range harness.JSONLines(t, k.log.String()) {
		msg, _ := l["msg"].(string)
		if strings.Contains(msg, "trying another provider") {
			t.Errorf("a log line says another provider is tried; none exists: %v", l)
		}
		if err, ok := l["err"].(string); ok {
			if strings.Contains(err, "was replaced") {
				t.Errorf("a log line says a generation was replaced; its node died: %v", l)
			}
			if p := repeatedPrefix(err); p != "" {
				t.Errorf("an error says %q twice: %v", p, l)
			}
		}
		if msg == "request" && l["outcome"] == "completed" {
			completed++
			if l["queue_reason"] != "queued" || l["queue_wait"].(float64) <= 0 {
				t.Errorf("a queued client's request line: %v", l)
			}
		}
	}
	if completed < 3*8 {
		t.Errorf("%d completed request lines, want at least %d", completed, 3*8)
	}
}

// repeatedPrefix returns the first part of an error text ("a: b: c")
// that the next part repeats, or "".
func repeatedPrefix(err string) string {
	parts := strings.Split(err, ": ")
	for i := 1; i < len(parts); i++ {
		if parts[i] == parts[i-1] {
			return parts[i]
		}
	}
	return ""
}
