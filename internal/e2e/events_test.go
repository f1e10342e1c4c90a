package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/lifecycle"
	"iop/internal/node"
	"iop/internal/sim"
	"iop/internal/sse"
)

// TestEventsStreamThroughARealEdge subscribes to /admin/v1/events, then
// connects a node and sends one request and one for an unknown model, and
// reads their lifecycle in order with the provider's load.
func TestEventsStreamThroughARealEdge(t *testing.T) {
	harness.Parallel(t)
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"m"}})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"pool": {Targets: []string{"m"}}}))
	t.Cleanup(cancel)

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.HTTPAddr+"/admin/v1/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	br.ReadString('\n') // "retry: 1000": subscribed
	sc := sse.NewScanner(br)
	next := func() lifecycle.Event {
		t.Helper()
		e, err := sc.Next()
		if err != nil {
			t.Fatalf("stream ended: %v", err)
		}
		var ev lifecycle.Event
		if err := json.Unmarshal(e.Data, &ev); err != nil {
			t.Fatal(err)
		}
		return ev
	}

	nodeCtx, stopNode := context.WithCancel(ctx)
	harness.Node(t, nodeCtx, node.Config{NodeID: "gpu-1", Edge: e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: "openai", BaseURL: url + "/v1", Models: []string{"m"}, Capacity: 3}}})
	if ev := next(); ev.Type != lifecycle.NodeConnected || ev.NodeID != "gpu-1" || ev.Generation == 0 || len(ev.Providers) != 1 {
		t.Fatalf("first event %+v", ev)
	}
	client := newClient(e)
	if _, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "pool",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err != nil {
		t.Fatal(err)
	}
	var run []lifecycle.Event
	for range 3 {
		run = append(run, next())
	}
	if run[0].Type != lifecycle.RunAdmitted || run[1].Type != lifecycle.RunStarted || run[2].Type != lifecycle.RunEnded {
		t.Fatalf("run events %+v", run)
	}
	for i, ev := range run {
		if ev.Model != "pool" || ev.NodeID != "gpu-1" || ev.ProviderID != "p" || ev.RunID != run[0].RunID || ev.Load == nil || ev.Load.Capacity != 3 {
			t.Errorf("run event %d %+v", i, ev)
		}
	}
	if run[0].Load.InFlight != 1 || run[2].Load.InFlight != 0 || run[0].QueueReason != "immediate" {
		t.Errorf("in-flight %d at admission, %d at the end", run[0].Load.InFlight, run[2].Load.InFlight)
	}
	if _, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{Model: "nope",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}); err == nil {
		t.Fatal("unknown model answered")
	}
	if ev := next(); ev.Type != lifecycle.RequestRefused || ev.Status != 404 || ev.Reason != "unknown_model" || ev.Model != "" {
		t.Errorf("refusal event %+v", ev)
	}
	stopNode()
	if ev := next(); ev.Type != lifecycle.NodeFenced || ev.NodeID != "gpu-1" || ev.Generation != 1 {
		t.Errorf("fence event %+v", ev)
	}
}
