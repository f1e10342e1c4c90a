package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/process"
	"iop/internal/sim"
)

// TestRollingRestartKeepsQueuedClients: 20 streaming clients queue for
// the only node of a model (capacity 2); the node (`iop node`, a real
// process) gets SIGTERM, drains and exits, and starts again. Every client
// is answered 200 with a whole answer: the queued ones were held through
// the restart (reconnect_grace), and a request that arrives while no node
// serves the model is held too instead of refused.
func TestRollingRestartKeepsQueuedClients(t *testing.T) {
	harness.Parallel(t)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 40, DefaultMaxTokens: 8})
	ctx, cancel := context.WithCancel(context.Background())
	cfg := process.DefaultEdgeFile()
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	cfg.Queue = edge.QueueConfig{MaxQueue: 32, QueueTimeout: 60 * time.Second, ReconnectGrace: 30 * time.Second}
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	path := filepath.Join(t.TempDir(), "node.yaml")
	writeAtomically(t, path, fmt.Sprintf("node_id: n1\nedge: %s\nproviders:\n  - {id: p1, type: ollama, base_url: %q, models: [m], capacity: 2}\n", e.NodeAddr, simURL))
	startNodeCmd := func() *harness.Command {
		return harness.StartCommand(t, ctx, "node", "--config", path, "--log-format", "json", "--drain-timeout", "20s")
	}
	first := startNodeCmd()
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return len(s.Providers) == 1 && s.Providers[0].Status == "available" })

	client := newClient(e)
	answers := make(chan error, 21)
	ask := func() {
		go func() {
			s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "m",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
			defer s.Close()
			finished := false
			for s.Next() {
				for _, c := range s.Current().Choices {
					finished = finished || c.FinishReason != ""
				}
			}
			switch {
			case s.Err() != nil:
				answers <- s.Err()
			case !finished:
				answers <- fmt.Errorf("stream ended without a finish reason")
			default:
				answers <- nil
			}
		}()
	}
	for range 20 {
		ask()
	}
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Waiters >= 15 })

	if err := first.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first.Done():
		if err != nil {
			t.Fatalf("node after SIGTERM: %v\n%s", err, first.Log.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("node did not stop after SIGTERM:\n%s", first.Log.String())
	}
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return len(s.Nodes) == 0 })
	ask() // no node serves m now: held for the grace, not refused
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Waiters >= 1 })

	startNodeCmd()
	for i := range 21 {
		select {
		case err := <-answers:
			if err != nil {
				t.Errorf("client %d: %v", i, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("only %d of 21 clients answered", i)
		}
	}
}
