package e2e

// End-to-end tests: a real edge (HTTP API + gRPC node endpoint on loopback
// TCP), real node agents dialing it over gRPC, and `iop sim` backends of
// both wire protocols as real HTTP servers, driven with the official OpenAI
// Go client.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
	"iop/internal/testenv"
)

func newClient(e *process.Process) openai.Client {
	return openai.NewClient(option.WithBaseURL("http://"+e.HTTPAddr+"/v1"), option.WithAPIKey("client-key"), option.WithMaxRetries(0))
}

func TestEndToEndBothExecutionPaths(t *testing.T) {
	harness.Parallel(t)
	const providerKey = "sk-provider-secret-42"
	keyEnv := harness.Env(t, providerKey)
	ollamaSim, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"llama3:8b"}, Seed: 7})
	openaiSim, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"meta-llama/Llama-3-8B"}, Seed: 7, APIKey: providerKey})

	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{
		"chat-normalized": {Targets: []string{"llama3:8b"}},
		"chat-tunnel":     {Targets: []string{"meta-llama/Llama-3-8B"}},
	}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "ollama-1", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"llama3:8b"}, Capacity: 2},
			{ID: "vllm-1", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{"meta-llama/Llama-3-8B"}, Capacity: 2, APIKeyEnv: keyEnv},
		},
	})
	client := newClient(e)

	paths := []struct {
		alias, served string
		backend       *sim.Server
	}{
		{"chat-normalized", "llama3:8b", ollamaSim},
		{"chat-tunnel", "meta-llama/Llama-3-8B", openaiSim},
	}
	for _, p := range paths {
		t.Run(p.alias+"/non-streaming", func(t *testing.T) {
			resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:     p.alias,
				Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("say something deterministic")},
				MaxTokens: openai.Int(5),
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Choices) != 1 || strings.TrimSpace(resp.Choices[0].Message.Content) == "" {
				t.Fatalf("no answer: %+v", resp)
			}
			if got := len(strings.Fields(resp.Choices[0].Message.Content)); got != 5 {
				t.Fatalf("max_tokens 5 gave %d tokens: %q", got, resp.Choices[0].Message.Content)
			}
			if resp.Choices[0].FinishReason != "length" {
				t.Fatalf("finish reason %q, want length", resp.Choices[0].FinishReason)
			}
			if resp.Usage.CompletionTokens != 5 || resp.Usage.PromptTokens != 3 {
				t.Fatalf("usage %+v", resp.Usage)
			}
			seen := p.backend.Seen()
			if last := seen[len(seen)-1]; last.Model != p.served {
				t.Fatalf("backend saw model %q, want the served name %q", last.Model, p.served)
			}
		})
		t.Run(p.alias+"/streaming", func(t *testing.T) {
			stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
				Model:         p.alias,
				Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("say something deterministic")},
				MaxTokens:     openai.Int(4),
				StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
			})
			var acc openai.ChatCompletionAccumulator
			chunks := 0
			for stream.Next() {
				acc.AddChunk(stream.Current())
				chunks++
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if got := len(strings.Fields(acc.Choices[0].Message.Content)); got != 4 || chunks < 5 {
				t.Fatalf("streamed %d chunks, content %q", chunks, acc.Choices[0].Message.Content)
			}
			if acc.Usage.CompletionTokens != 4 {
				t.Fatalf("usage %+v", acc.Usage)
			}
			seen := p.backend.Seen()
			if last := seen[len(seen)-1]; last.Model != p.served {
				t.Fatalf("backend saw model %q, want %q", last.Model, p.served)
			}
		})
	}

	t.Run("deterministic across paths", func(t *testing.T) {
		// Both simulators share a seed, so the same prompt gives the same
		// text whichever path carried it.
		var texts []string
		for _, p := range paths {
			resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
				Model:    p.alias,
				Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("same prompt")},
			})
			if err != nil {
				t.Fatal(err)
			}
			texts = append(texts, resp.Choices[0].Message.Content)
		}
		if texts[0] != texts[1] {
			t.Fatalf("normalized %q != tunnel %q", texts[0], texts[1])
		}
	})

	t.Run("provider key reaches the backend only", func(t *testing.T) {
		for _, s := range openaiSim.Seen() {
			if s.Authorization != "Bearer "+providerKey {
				t.Fatalf("backend saw Authorization %q", s.Authorization)
			}
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+e.HTTPAddr+"/v1/chat/completions",
			strings.NewReader(`{"model":"chat-tunnel","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer client-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), providerKey) || strings.Contains(fmt.Sprint(resp.Header), providerKey) {
			t.Fatal("the provider key leaked to the client")
		}
		if !strings.HasSuffix(string(body), "data: [DONE]\n\n") {
			t.Fatalf("tunnel stream did not end with [DONE]: %q", body)
		}
		for _, s := range openaiSim.Seen() {
			if strings.Contains(s.Authorization, "client-key") {
				t.Fatal("the client's own key reached the provider")
			}
		}
	})

	t.Run("models", func(t *testing.T) {
		page, err := client.Models.List(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		want := "[chat-normalized chat-tunnel llama3:8b meta-llama/Llama-3-8B]"
		if fmt.Sprint(ids) != want {
			t.Fatalf("models %v, want %s", ids, want)
		}
	})

	t.Run("unknown model is a 404 OpenAI error", func(t *testing.T) {
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:    "no-such-model",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
		})
		var apiErr *openai.Error
		if !errorsAs(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Fatalf("err %v, want a 404", err)
		}
	})

	t.Run("missing capability is a 400 naming it", func(t *testing.T) {
		_, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model:    "chat-tunnel",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
			Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
				Name: "get_weather",
			})},
		})
		var apiErr *openai.Error
		if !errorsAs(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.Message, "tools") {
			t.Fatalf("err %v, want a 400 naming tools", err)
		}
	})

	waitIdle(t, e)
}

// waitIdle waits until the edge holds no lease and no waiter: every slot
// was given back.
// waitWarm waits until every node connected to e keeps its
// node.WarmStreams warm run streams open, idle.
func waitWarm(t *testing.T, e *process.Process) {
	t.Helper()
	testenv.Eventually(t, "the nodes' warm run streams", func() bool {
		for _, n := range e.Service.Snapshot().Nodes {
			if n.IdleRunStreams != node.WarmStreams {
				return false
			}
		}
		return true
	})
}

func waitIdle(t *testing.T, e *process.Process) {
	t.Helper()
	// A client may see the end of its answer just before the edge handles
	// the run's terminal message: poll, bounded.
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		snap := e.Service.Snapshot()
		if snap.Leases == 0 && snap.Waiters == 0 {
			for _, p := range snap.Providers {
				if p.InFlight != 0 {
					t.Fatalf("provider %s/%s in-flight %d", p.NodeID, p.ProviderID, p.InFlight)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots still held: %+v", snap)
		}
		<-tick.C
	}
}

func TestCapacityNeverExceededUnderConcurrency(t *testing.T) {
	harness.Parallel(t)
	const nodes, capacity, clients, perClient = 3, 2, 20, 3
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"pool": {Targets: []string{"m"}, MaxQueue: clients}}))
	t.Cleanup(cancel)
	var sims []*sim.Server
	for i := range nodes {
		// The simulator counts its own concurrency and would answer 429
		// past its capacity; a slow token rate keeps requests overlapping.
		protocol := sim.ProtocolOllama
		typ, path := node.TypeOllama, ""
		if i%2 == 1 {
			protocol, typ, path = sim.ProtocolOpenAI, "openai", "/v1"
		}
		s, url := harness.Sim(t, sim.Config{Protocol: protocol, Models: []string{"m"}, MaxConcurrent: capacity, TokensPerSecond: 2000, DefaultMaxTokens: 8})
		sims = append(sims, s)
		harness.Node(t, ctx, node.Config{
			NodeID:    fmt.Sprintf("node-%d", i),
			Edge:      e.NodeAddr,
			Providers: []node.ProviderConfig{{ID: "p", Type: typ, BaseURL: url + path, Models: []string{"m"}, Capacity: capacity}},
		})
	}
	client := newClient(e)
	var wg sync.WaitGroup
	errs := make(chan error, clients*perClient)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perClient {
				if (c+i)%2 == 0 {
					resp, err := client.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
						Model:    "pool",
						Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("client %d request %d", c, i))},
					})
					if err == nil && resp.Choices[0].Message.Content == "" {
						err = fmt.Errorf("empty answer")
					}
					errs <- err
					continue
				}
				stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
					Model:    "pool",
					Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("client %d stream %d", c, i))},
				})
				n := 0
				for stream.Next() {
					n++
				}
				err := stream.Err()
				if err == nil && n == 0 {
					err = fmt.Errorf("empty stream")
				}
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("request failed: %v", err)
		}
	}
	total := 0
	for i, s := range sims {
		st := s.Stats()
		if st.MaxInFlight > capacity {
			t.Errorf("sim %d saw %d concurrent requests, capacity %d", i, st.MaxInFlight, capacity)
		}
		if st.Rejected != 0 {
			t.Errorf("sim %d rejected %d requests over capacity", i, st.Rejected)
		}
		total += int(st.Requests)
	}
	if total != clients*perClient {
		t.Errorf("backends served %d requests, want %d", total, clients*perClient)
	}
	waitIdle(t, e)
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// TestAdminAPIMatchesScheduler holds two streams open on a capacity-2
// provider and checks that the admin routes report what the edge's own
// snapshot (the scheduler's counters) says.
func TestAdminAPIMatchesScheduler(t *testing.T) {
	harness.Parallel(t)
	// One token a second after the first: a stream stays open until closed.
	_, url := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"m"}, TokensPerSecond: 1, DefaultMaxTokens: 1000})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{"pool": {Targets: []string{"m"}}}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID:    "gpu-1",
		Label:     "rack a",
		Edge:      e.NodeAddr,
		Providers: []node.ProviderConfig{{ID: "p", Type: node.TypeOllama, BaseURL: url, Models: []string{"m"}, Capacity: 2}},
	})
	client := newClient(e)

	var streams []*ssestream.Stream[openai.ChatCompletionChunk]
	for i := range 2 {
		stream := client.Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
			Model:    "pool",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("stream %d", i))},
		})
		// A first chunk means the request holds its slot.
		if !stream.Next() {
			t.Fatalf("stream %d ended before its first chunk: %v", i, stream.Err())
		}
		defer stream.Close()
		streams = append(streams, stream)
	}
	// A third request waits in the queue (the scheduler lists a model's
	// queue once a request has waited in it) until its client leaves.
	waitCtx, leave := context.WithCancel(context.Background())
	waited := make(chan error, 1)
	go func() {
		_, err := client.Chat.Completions.New(waitCtx, openai.ChatCompletionNewParams{
			Model:    "pool",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("queued")},
		})
		waited <- err
	}()
	defer func() {
		leave()
		if err := <-waited; !errors.Is(err, context.Canceled) {
			t.Errorf("queued request: %v, want context.Canceled", err)
		}
	}()
	snap := waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Waiters == 1 })

	var providers []struct {
		NodeID       string   `json:"node_id"`
		ProviderID   string   `json:"provider_id"`
		Type         string   `json:"type"`
		Capacity     int      `json:"capacity"`
		InFlight     int      `json:"in_flight"`
		Queued       int      `json:"queued"`
		LoadRatio    float64  `json:"load_ratio"`
		Health       string   `json:"health"`
		Models       []string `json:"models"`
		Capabilities []string `json:"capabilities"`
		Status       string   `json:"status"`
	}
	getJSON(t, e, "/admin/v1/providers", &providers)
	if len(providers) != 1 || len(snap.Providers) != 1 {
		t.Fatalf("admin providers %+v, snapshot %+v: want one each", providers, snap.Providers)
	}
	p := providers[0]
	if p.NodeID != "gpu-1" || p.ProviderID != "p" || p.Type != node.TypeOllama || p.Capacity != 2 ||
		p.LoadRatio != 1 || p.Health != "healthy" || p.Status != "available" || fmt.Sprint(p.Models) != "[m]" || p.Capabilities == nil {
		t.Errorf("admin provider %+v", p)
	}
	if p.InFlight != 2 || p.InFlight != snap.Providers[0].InFlight {
		t.Errorf("admin in_flight %d, snapshot %d, want 2", p.InFlight, snap.Providers[0].InFlight)
	}
	if p.Queued != 1 || p.Queued != snap.Providers[0].Queued {
		t.Errorf("admin queued %d, snapshot %d, want 1", p.Queued, snap.Providers[0].Queued)
	}

	var nodes []struct {
		ID             string   `json:"id"`
		Label          string   `json:"label"`
		Generation     uint64   `json:"generation"`
		ConnectedSince string   `json:"connected_since"`
		LastHeartbeat  string   `json:"last_heartbeat"`
		Providers      []string `json:"providers"`
	}
	getJSON(t, e, "/admin/v1/nodes", &nodes)
	if len(nodes) != 1 || len(snap.Nodes) != 1 {
		t.Fatalf("admin nodes %+v, snapshot %+v: want one each", nodes, snap.Nodes)
	}
	n := nodes[0]
	if n.ID != "gpu-1" || n.Label != "rack a" || n.Generation == 0 || n.Generation != snap.Nodes[0].Generation || fmt.Sprint(n.Providers) != "[p]" {
		t.Errorf("admin node %+v, snapshot generation %d", n, snap.Nodes[0].Generation)
	}
	for _, ts := range []string{n.ConnectedSince, n.LastHeartbeat} {
		if _, err := time.Parse(time.RFC3339, ts); err != nil {
			t.Errorf("time %q is not RFC 3339: %v", ts, err)
		}
	}

	var queues []struct {
		Model  string `json:"model"`
		Policy struct {
			MaxQueue       int   `json:"max_queue"`
			QueueTimeoutMS int64 `json:"queue_timeout_ms"`
		} `json:"policy"`
		Queued int `json:"queued"`
	}
	getJSON(t, e, "/admin/v1/queues", &queues)
	if len(queues) != 1 || queues[0].Model != "pool" || queues[0].Queued != 1 ||
		queues[0].Policy.MaxQueue != edge.DefaultMaxQueue || queues[0].Policy.QueueTimeoutMS != edge.DefaultQueueTimeout.Milliseconds() {
		t.Errorf("admin queues %+v", queues)
	}

	// Closing the requests gives every slot back.
	leave()
	for _, s := range streams {
		s.Close()
	}
	waitIdle(t, e)
}

// waitSnapshot polls the edge's snapshot, bounded, until ok accepts it.
func waitSnapshot(t *testing.T, e *process.Process, ok func(contract.Snapshot) bool) contract.Snapshot {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		snap := e.Service.Snapshot()
		if ok(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot never reached the state: %+v", snap)
		}
		<-tick.C
	}
}

// getJSON GETs path from the edge's HTTP API and decodes its 200 JSON body
// into v.
func getJSON(t *testing.T, e *process.Process, path string, v any) {
	t.Helper()
	resp, err := http.Get("http://" + e.HTTPAddr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, body)
	}
}
