package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/openai/openai-go/v3"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/sim"
	"iop/internal/testenv"
)

// countLogs counts the lines of c's JSON log whose msg is msg.
func countLogs(t *testing.T, c *harness.Command, msg string) int {
	n := 0
	for _, l := range harness.JSONLines(t, c.Log.String()) {
		if l["msg"] == msg {
			n++
		}
	}
	return n
}

// lastLog returns the last line of c's JSON log whose msg is msg.
func lastLog(t *testing.T, c *harness.Command, msg string) map[string]any {
	var last map[string]any
	for _, l := range harness.JSONLines(t, c.Log.String()) {
		if l["msg"] == msg {
			last = l
		}
	}
	return last
}

// TestSIGHUPReloadsNodeWhileStreaming runs `iop node --config FILE` (a
// simulator behind it, capacity 2) and streams two answers through the
// edge; mid-stream the file's capacity becomes 4 and the node gets SIGHUP:
// the log says what changed, the edge sees capacity 4, both streams
// complete; then a broken file and SIGHUP: refused in the log, the old
// config kept, the node alive and serving.
func TestSIGHUPReloadsNodeWhileStreaming(t *testing.T) {
	harness.Parallel(t)
	_, simURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 40, DefaultMaxTokens: 60})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	t.Cleanup(cancel)
	path := filepath.Join(t.TempDir(), "node.yaml")
	nodeYAML := func(capacity int) string {
		return fmt.Sprintf("node_id: n1\nedge: %s\nproviders:\n  - {id: p1, type: ollama, base_url: %q, models: [m], capacity: %d}\n", e.NodeAddr, simURL, capacity)
	}
	writeAtomically(t, path, nodeYAML(2))
	nodeCmd := harness.StartCommand(t, ctx, "node", "--config", path, "--log-format", "json")
	capacity := func(s contract.Snapshot) int {
		for _, p := range s.Providers {
			if p.ProviderID == "p1" {
				return p.Capacity
			}
		}
		return 0
	}
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return capacity(s) == 2 })

	client := newClient(e)
	streams := make(chan error, 2)
	started := make(chan struct{}, 2)
	for range 2 {
		go func() {
			s := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "m",
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
			defer s.Close()
			n := 0
			finished := false
			for s.Next() {
				if n++; n == 1 {
					started <- struct{}{}
				}
				for _, c := range s.Current().Choices {
					finished = finished || c.FinishReason == "stop" || c.FinishReason == "length"
				}
			}
			if err := s.Err(); err != nil {
				streams <- err
				return
			}
			if !finished {
				streams <- fmt.Errorf("stream ended without a finish reason after %d chunks", n)
				return
			}
			streams <- nil
		}()
	}
	<-started
	<-started

	writeAtomically(t, path, nodeYAML(4))
	if err := nodeCmd.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reloaded := nodeCmd.WaitLog(t, "config reloaded")
	if applied := fmt.Sprint(reloaded["applied"]); !strings.Contains(applied, `provider "p1" capacity 4`) || reloaded["trigger"] != "SIGHUP" {
		t.Errorf("reload line %v", reloaded)
	}
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return capacity(s) == 4 })
	for range 2 {
		if err := <-streams; err != nil {
			t.Errorf("a stream across the SIGHUP: %v", err)
		}
	}

	// A broken file: refused, the running config stays, the node serves.
	writeAtomically(t, path, "node_id: n1\nproviders: [{id: p1, capcity: 3}]\n")
	if err := nodeCmd.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	refused := nodeCmd.WaitLog(t, "config reload refused; the running config stays")
	if err, _ := refused["err"].(string); !strings.Contains(err, "capcity") || refused["level"] != "ERROR" {
		t.Errorf("refusal line %v", refused)
	}
	if _, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "m", MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err != nil {
		t.Fatalf("after a refused reload: %v", err)
	}
	if c := capacity(e.Service.Snapshot()); c != 4 {
		t.Errorf("capacity %d after a refused reload, want 4", c)
	}
	select {
	case err := <-nodeCmd.Done():
		t.Fatalf("node exited after SIGHUP: %v\n%s", err, nodeCmd.Log.String())
	default:
	}
}

// TestRegression_SIGHUPStopsNoProcess sends SIGHUP, twice, to `iop edge`
// without --config, `iop dev` and `iop sim`: each logs it and keeps
// running (the second SIGHUP's line shows it is still there). Before, a
// process that did not catch SIGHUP died of it with no log line.
func TestRegression_SIGHUPStopsNoProcess(t *testing.T) {
	harness.Parallel(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"edge", "--listen", "127.0.0.1:0", "--node-listen", "127.0.0.1:0", "--database", ":memory:"}, "nothing to reload: started without --config; the process keeps running"},
		{[]string{"dev", "--sim", "--listen", "127.0.0.1:0", "--database", ":memory:"}, "nothing to reload: started without --config; the process keeps running"},
		{[]string{"sim", "--listen", "127.0.0.1:0"}, "SIGHUP: iop sim reads no config again; restart it to change its settings"},
	}
	for _, c := range cases {
		t.Run(c.args[0], func(t *testing.T) {
			cmd := harness.StartCommand(t, ctx, append(c.args, "--log-format", "json")...)
			switch c.args[0] {
			case "sim":
				testenv.Eventually(t, "sim listening", func() bool { return strings.Contains(cmd.Out.String(), "listening") })
			case "dev":
				testenv.Eventually(t, "dev banner", func() bool { return strings.Contains(cmd.Out.String(), "iop dev is ready") })
			default:
				cmd.WaitLog(t, "edge ready")
			}
			for i := 1; i <= 2; i++ {
				if err := cmd.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
					t.Fatal(err)
				}
				testenv.Eventually(t, fmt.Sprintf("SIGHUP line %d", i), func() bool {
					select {
					case err := <-cmd.Done():
						t.Fatalf("%s exited on SIGHUP: %v\n%s", c.args[0], err, cmd.Log.String())
					default:
					}
					return countLogs(t, cmd, c.msg) == i
				})
			}
			if err := cmd.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := <-cmd.Done(); err != nil {
				t.Errorf("%s after SIGTERM: %v", c.args[0], err)
			}
		})
	}
}
