package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/status"
	"iop/internal/testenv"
)

// clearScreen is the ANSI sequence (cursor home, clear) iop status --watch
// draws before each frame.
const clearScreen = "\x1b[H\x1b[2J"

// TestStatusCommand runs `iop status` against a real edge holding one
// stream on a capacity-2 provider: the table, --json (equal to the edge's
// snapshot) and --watch (refreshes until stopped). The stream lasts 500 s
// (1000 tokens at 2 a second), held until the test closes it: at 50 a
// second it ended before iop status read it on a loaded machine.
func TestStatusCommand(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 2, DefaultMaxTokens: 1000})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"pool": {Targets: []string{"m"}}}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{NodeID: "gpu-1", Label: "rack a", Version: "9.9", Edge: e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 2}}})
	client := newClient(e)
	stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{Model: "pool",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hold")}})
	if !stream.Next() {
		t.Fatal(stream.Err())
	}
	snap := e.Service.Snapshot()

	run := func(args ...string) string {
		t.Helper()
		c := harness.StartCommand(t, context.Background(), append([]string{"status", "--edge", e.HTTPAddr}, args...)...)
		if err := <-c.Done(); err != nil {
			t.Fatalf("iop status %v: %v\n%s", args, err, c.Log.String())
		}
		return c.Out.String()
	}
	table := run()
	for _, want := range []string{"NODES (1)", "gpu-1", "rack a", "9.9", "PROVIDERS (1)", "1/2", "[#####     ]", "healthy", "available", "QUEUES (1)"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if line := lineWith(table, "ollama"); !strings.HasPrefix(line, "gpu-1") || !strings.Contains(line, " p ") || !strings.HasSuffix(line, " m") {
		t.Errorf("provider row %q", line)
	}
	// The alias's queue is listed though nothing waits in it: queued 0, its policy.
	if fields := strings.Fields(lineWith(table, "pool")); strings.Join(fields, " ") != "pool 0 16 30s on -" {
		t.Errorf("queue row %q, want pool 0 16 30s on -", fields)
	}

	var v status.View
	if err := json.Unmarshal([]byte(run("--json")), &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Nodes) != 1 || v.Nodes[0].ID != "gpu-1" || v.Nodes[0].Generation != snap.Nodes[0].Generation {
		t.Errorf("json nodes %+v, snapshot %+v", v.Nodes, snap.Nodes)
	}
	if len(v.Providers) != 1 || v.Providers[0].InFlight != snap.Providers[0].InFlight || v.Providers[0].Capacity != 2 || v.Providers[0].InFlight != 1 {
		t.Errorf("json providers %+v, snapshot %+v", v.Providers, snap.Providers)
	}

	// --watch draws frames until its context ends.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	c := harness.StartCommand(t, watchCtx, "status", "--edge", "http://"+e.HTTPAddr+"/", "--watch", "--interval", "10ms")
	testenv.Eventually(t, "three frames", func() bool { return strings.Count(c.Out.String(), clearScreen) >= 3 })
	stopWatch()
	if err := <-c.Done(); err != nil {
		t.Fatalf("--watch: %v", err)
	}
	frames := strings.Split(c.Out.String(), clearScreen)
	if !strings.Contains(frames[2], "gpu-1") {
		t.Errorf("second frame %q", frames[2])
	}

	// An edge that does not answer is an error.
	bad := harness.StartCommand(t, context.Background(), "status", "--edge", "127.0.0.1:1")
	if err := <-bad.Done(); err == nil {
		t.Error("status of a missing edge succeeded")
	}
	stream.Close()
	waitIdle(t, e)
}

func lineWith(text, sub string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return fmt.Sprintf("<no line with %q>", sub)
}
