package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
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

// TestGuaranteesOnTheInMemoryLink runs the end-to-end tests of the node
// link's guarantees with their node in the edge's process, on its
// in-memory link (package memlink) instead of gRPC: a client's cancel
// reaching the provider mid-stream and while queued, a slow reader losing
// its slot, a stalled run holding up no other run of its connection,
// capacity never exceeded under concurrency, bodies of every size, a
// provider dying mid-stream, the edge's stop answering every request
// (the storm of 1,000 clients: TestStormOnTheInMemoryLink). The
// gRPC row of the table is each test run on its own.
func TestGuaranteesOnTheInMemoryLink(t *testing.T) {
	t.Parallel() // each row's test takes a slot
	harness.UseLink(t, harness.LinkMemory)
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"ClientGoneCancelsRun", TestClientGoneCancelsRun},
		{"SlowReaderLosesItsSlot", TestSlowReaderLosesItsSlot},
		{"StalledRunDoesNotHoldUpItsConnection", TestStalledRunDoesNotHoldUpItsConnection},
		{"EndToEndBothExecutionPaths", TestEndToEndBothExecutionPaths},
		{"CapacityNeverExceededUnderConcurrency", TestCapacityNeverExceededUnderConcurrency},
		{"EndToEndBodySizes", TestEndToEndBodySizes},
		{"FaultProviderDiesMidStream", TestFaultProviderDiesMidStream},
		{"FaultFailingProviderAnswersAtOnce", TestFaultFailingProviderAnswersAtOnce},
		{"EdgeStopEndsRequestsWithAnAnswer", TestRegression_EdgeStopEndsRequestsWithAnAnswer},
	} {
		// Each row is parallel, as the test it runs is on the gRPC link.
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			t.Run(harness.LinkMemory, tc.test)
		})
	}
}

// TestStormOnTheInMemoryLink is TestStormAdmitsCapacityPlusQueue with its
// node in the edge's process. It stands alone (not parallel): it counts
// every goroutine of the test binary, and its burst of 1,000 clients
// beside the parallel tests (even in a process of its own) starved its
// node's dispatches on a loaded 2-core machine.
func TestStormOnTheInMemoryLink(t *testing.T) {
	harness.UseLink(t, harness.LinkMemory)
	TestStormAdmitsCapacityPlusQueue(t)
}

// TestInProcessNodeRestartIsANewGeneration: a node in the edge's process
// that stops and starts again is a new generation, as a remote node's
// reconnect is. Its run in flight at the stop ends with an error event
// (never a clean end), its slot comes back, and the new generation serves.
func TestInProcessNodeRestartIsANewGeneration(t *testing.T) {
	harness.Parallel(t)
	harness.UseLink(t, harness.LinkMemory)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}, TokensPerSecond: 50, DefaultMaxTokens: 100_000})
	ctx := context.Background()
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{}))
	cfg := node.Config{NodeID: "local", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "p", Type: "vllm", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 1},
	}}
	firstCtx, stopFirst := context.WithCancel(ctx)
	first := harness.Node(t, firstCtx, cfg)
	gen1 := first.Generations()[node.InProcessEdge]
	if gen1 == 0 {
		t.Fatalf("the in-process node's generations: %v", first.Generations())
	}

	body := `{"model":"m","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"go on"}]}`
	resp, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 1)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("no first byte: %v", err)
	}
	stopFirst()
	rest := readAllString(t, resp)
	if strings.Contains(rest, "[DONE]") || !strings.Contains(rest, `"error"`) {
		t.Fatalf("the run cut by the node's stop ended without an error event: ...%s", tail(rest, 300))
	}
	waitIdle(t, e)

	second := harness.Node(t, ctx, cfg)
	gen2 := second.Generations()[node.InProcessEdge]
	if gen2 <= gen1 {
		t.Fatalf("generation after the restart %d, want above %d", gen2, gen1)
	}
	testenv.Eventually(t, "the restarted node serves", func() bool {
		r, err := http.Post("http://"+e.HTTPAddr+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	waitIdle(t, e)
}

func readAllString(t *testing.T, resp *http.Response) string {
	t.Helper()
	var sb strings.Builder
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			sb.Write(buf[:n])
			if err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(testenv.WaitDeadline):
		t.Fatal("the answer did not end")
	}
	return sb.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// TestEdgeServesItsOwnProviders: `iop edge` with providers (EdgeFile)
// serves them by a node in its own process, on its in-memory link, named
// local_node_id; remote nodes still connect beside it; the edge's stop
// drains that node after its requests.
func TestEdgeServesItsOwnProviders(t *testing.T) {
	harness.Parallel(t)
	_, localURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"local-m"}})
	_, remoteURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"remote-m"}})
	cfg := harness.EdgeConfig(map[string]edge.ModelConfig{})
	cfg.Listen, cfg.NodeListen, cfg.Database = "127.0.0.1:0", "127.0.0.1:0", ":memory:"
	cfg.LocalNodeID = "gpu-host"
	cfg.Providers = []node.ProviderConfig{{ID: "vllm", Type: "vllm", BaseURL: localURL + "/v1", Models: []string{"local-m"}, Capacity: 2}}
	ctx, cancel := context.WithCancel(context.Background())
	e, err := process.Start(ctx, process.Config{Mode: process.ModeEdge, Edge: cfg}, process.Deps{Logger: harness.Logger(t, "edge")})
	if err != nil {
		t.Fatal(err)
	}
	harness.StopAtCleanup(t, cancel, e)
	if e.Agent == nil || e.Agent.Generations()[node.InProcessEdge] == 0 {
		t.Fatalf("the edge's own node is not connected in memory: %v", e.Agent)
	}
	harness.Node(t, ctx, node.Config{NodeID: "remote", Edge: e.NodeAddr, Providers: []node.ProviderConfig{
		{ID: "ollama", Type: node.TypeOllama, BaseURL: remoteURL, Models: []string{"remote-m"}}}})

	client := newClient(e)
	for _, m := range []string{"local-m", "remote-m"} {
		if err := <-intactRun(client, m, 5); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	nodes := map[string]bool{}
	for _, p := range e.Service.Snapshot().Providers {
		nodes[p.NodeID+"/"+p.ProviderID] = true
	}
	if !nodes["gpu-host/vllm"] || !nodes["remote/ollama"] {
		t.Fatalf("providers %v, want gpu-host/vllm (in the edge's process) and remote/ollama", nodes)
	}
	waitIdle(t, e)
}

// TestRegression_EdgeOwnNodeReportsTheBinaryVersion: the node in the
// edge's own process (iop edge with providers:) reports the iop binary's
// version (-X main.version), as a remote node does; it reported the Go
// module's version because iop edge did not pass the binary's on.
func TestRegression_EdgeOwnNodeReportsTheBinaryVersion(t *testing.T) {
	harness.Parallel(t)
	bin := harness.IOP(t) // stamped with harness.Version, as make build stamps a release
	simURL := startSimProcess(t, bin, "openai", "m", 400)
	httpAddr := testenv.ProcessAddr(t)
	cfgPath := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(cfgPath, []byte(fmt.Sprintf(`listen: %s
node_listen: 127.0.0.1:0
database: ":memory:"
providers:
  - {id: p1, type: openai, base_url: %q, models: [m]}
`, httpAddr, simURL+"/v1")), 0o600); err != nil {
		t.Fatal(err)
	}
	harness.StartProgram(t, nil, "edge", bin, "edge", "--config", cfgPath)
	var nodes []struct {
		ID      string `json:"id"`
		Version string `json:"version"`
	}
	testenv.Eventually(t, "the edge lists its own node", func() bool {
		resp, err := http.Get("http://" + httpAddr + "/admin/v1/nodes")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return json.NewDecoder(resp.Body).Decode(&nodes) == nil && len(nodes) == 1
	})
	if n := nodes[0]; n.ID != process.DefaultLocalNodeID || n.Version != harness.Version {
		t.Fatalf("the edge's own node %+v, want version %q", n, harness.Version)
	}
}
