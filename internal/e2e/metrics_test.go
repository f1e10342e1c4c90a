package e2e

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"iop/internal/e2e/harness"
	"iop/internal/edge"
	"iop/internal/edge/contract"
	"iop/internal/node"
	"iop/internal/process"
	"iop/internal/sim"
)

// scrape GETs /metrics from the edge and parses the text exposition.
func scrape(t *testing.T, e *process.Process) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + e.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d", resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// metricValue is the value of the series of family name whose labels are
// exactly labels ("k=v,k=v", sorted by key); a histogram's is its sample
// count. ok is false when there is no such series.
func metricValue(fams map[string]*dto.MetricFamily, name, labels string) (v float64, ok bool) {
	fam := fams[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.GetMetric() {
		var ls []string
		for _, l := range m.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		sort.Strings(ls)
		if strings.Join(ls, ",") != labels {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// familySum adds up the values of every series of a counter or gauge family.
func familySum(fams map[string]*dto.MetricFamily, name string) float64 {
	sum := 0.0
	for _, m := range fams[name].GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}

// TestMetricsAfterAScriptedWorkload drives both execution paths, an
// unknown model and a forced queue overflow through a real edge, node and
// simulators, then scrapes /metrics and checks the exact counts, the token
// totals against the usage the simulators reported, and that every
// in-flight gauge is back to 0.
func TestMetricsAfterAScriptedWorkload(t *testing.T) {
	harness.Parallel(t)
	_, ollamaURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"llama3:8b"}, Seed: 7})
	_, openaiURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOpenAI, Models: []string{"gpt-sim"}, Seed: 7})
	// 50 tokens a second: a 1000-token answer holds its slot until closed.
	_, slowURL := harness.Sim(t, sim.Config{Protocol: sim.ProtocolOllama, Models: []string{"slow-m"}, TokensPerSecond: 50, DefaultMaxTokens: 1000})
	ctx, cancel := context.WithCancel(context.Background())
	e := harness.Edge(t, ctx, harness.EdgeConfig(map[string]edge.ModelConfig{
		"chat-normalized": {Targets: []string{"llama3:8b"}},
		"chat-tunnel":     {Targets: []string{"gpt-sim"}},
		"slow":            {Targets: []string{"slow-m"}, MaxQueue: 1},
	}))
	t.Cleanup(cancel)
	harness.Node(t, ctx, node.Config{
		NodeID: "gpu-1",
		Edge:   e.NodeAddr,
		Providers: []node.ProviderConfig{
			{ID: "ollama", Type: node.TypeOllama, BaseURL: ollamaURL, Models: []string{"llama3:8b"}, Capacity: 2},
			{ID: "vllm", Type: "vllm", BaseURL: openaiURL + "/v1", Models: []string{"gpt-sim"}, Capacity: 2},
			{ID: "slow", Type: node.TypeOllama, BaseURL: slowURL, Models: []string{"slow-m"}, Capacity: 1},
		},
	})
	client := newClient(e)
	bg := context.Background()
	params := func(model string, maxTokens int64) openai.ChatCompletionNewParams {
		return openai.ChatCompletionNewParams{
			Model:     model,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("say something deterministic")},
			MaxTokens: openai.Int(maxTokens),
		}
	}
	// usage[model] sums the usage the clients received: the simulators'.
	type usage struct{ in, out int64 }
	sums := map[string]*usage{"chat-normalized": {}, "chat-tunnel": {}}
	for _, model := range []string{"chat-normalized", "chat-tunnel"} {
		resp, err := client.Chat.Completions.New(bg, params(model, 5))
		if err != nil {
			t.Fatal(err)
		}
		sums[model].in += resp.Usage.PromptTokens
		sums[model].out += resp.Usage.CompletionTokens

		p := params(model, 4)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := client.Chat.Completions.NewStreaming(bg, p)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if acc.Usage.CompletionTokens != 4 {
			t.Fatalf("%s stream usage %+v", model, acc.Usage)
		}
		sums[model].in += acc.Usage.PromptTokens
		sums[model].out += acc.Usage.CompletionTokens
	}
	// A tunnel stream without include_usage: the provider sends no usage,
	// so its tokens are not counted.
	stream := client.Chat.Completions.NewStreaming(bg, params("chat-tunnel", 3))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Chat.Completions.New(bg, params("no-such-model", 1)); err == nil {
		t.Fatal("unknown model answered")
	}

	// Overflow "slow" (capacity 1, max_queue 1): one holds the slot, one
	// waits, the third is refused 429.
	holder := client.Chat.Completions.NewStreaming(bg, params("slow", 1000))
	if !holder.Next() {
		t.Fatalf("holder: %v", holder.Err())
	}
	waited := make(chan error, 1)
	go func() {
		_, err := client.Chat.Completions.New(bg, params("slow", 2))
		waited <- err
	}()
	waitSnapshot(t, e, func(s contract.Snapshot) bool { return s.Waiters == 1 })
	_, err := client.Chat.Completions.New(bg, params("slow", 2))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("overflow: %v, want 429", err)
	}
	holder.Close() // the client leaves; the waiter gets the slot
	if err := <-waited; err != nil {
		t.Fatalf("queued request: %v", err)
	}
	waitIdle(t, e)

	// Each request is counted when its handler finishes, which may be just
	// after its client read the end: poll, bounded, for all 9.
	var fams map[string]*dto.MetricFamily
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		fams = scrape(t, e)
		if familySum(fams, "iop_requests_total") == 9 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("requests counted: %v, want 9: %v", familySum(fams, "iop_requests_total"), fams["iop_requests_total"])
		}
		<-tick.C
	}
	want := []struct {
		name, labels string
		value        float64
	}{
		{"iop_requests_total", "api=chat.completions,model=chat-normalized,outcome=completed,status=200", 2},
		{"iop_requests_total", "api=chat.completions,model=chat-tunnel,outcome=completed,status=200", 3},
		{"iop_requests_total", "api=chat.completions,model=,outcome=refused,status=404", 1},
		{"iop_requests_total", "api=chat.completions,model=slow,outcome=refused,status=429", 1},
		{"iop_requests_total", "api=chat.completions,model=slow,outcome=client_gone,status=200", 1},
		{"iop_requests_total", "api=chat.completions,model=slow,outcome=completed,status=200", 1},
		{"iop_admissions_total", "model=chat-normalized,reason=immediate", 2},
		{"iop_admissions_total", "model=chat-tunnel,reason=immediate", 3},
		{"iop_admissions_total", "model=,reason=unknown_model", 1},
		{"iop_admissions_total", "model=slow,reason=immediate", 1},
		{"iop_admissions_total", "model=slow,reason=queued", 1},
		{"iop_admissions_total", "model=slow,reason=queue_full", 1},
		{"iop_input_tokens_total", "model=chat-normalized", float64(sums["chat-normalized"].in)},
		{"iop_output_tokens_total", "model=chat-normalized", float64(sums["chat-normalized"].out)},
		{"iop_input_tokens_total", "model=chat-tunnel", float64(sums["chat-tunnel"].in)},
		{"iop_output_tokens_total", "model=chat-tunnel", float64(sums["chat-tunnel"].out)},
		{"iop_queue_wait_seconds", "model=slow", 2},
		{"iop_request_duration_seconds", "api=chat.completions,model=chat-tunnel", 3},
		{"iop_time_to_first_token_seconds", "model=chat-normalized,path=normalized", 2},
		{"iop_time_to_first_token_seconds", "model=chat-tunnel,path=tunnel", 2}, // the streams; a JSON answer has none
		{"iop_inter_token_latency_seconds", "model=chat-normalized,path=normalized", 2},
		{"iop_nodes_connected", "", 1},
		{"iop_node_connects_total", "node=gpu-1", 1},
		{"iop_provider_capacity", "node=gpu-1,provider=vllm", 2},
		{"iop_provider_healthy", "node=gpu-1,provider=slow", 1},
		{"iop_queue_depth", "model=slow", 0},
		{"iop_queue_max", "model=slow", 1},
	}
	for _, w := range want {
		if got, ok := metricValue(fams, w.name, w.labels); !ok || got != w.value {
			t.Errorf("%s{%s} = %v (present %v), want %v", w.name, w.labels, got, ok, w.value)
		}
	}
	if sums["chat-tunnel"].out != 9 || sums["chat-normalized"].out != 9 {
		t.Errorf("usage the clients saw: %+v %+v", *sums["chat-normalized"], *sums["chat-tunnel"])
	}
	// At rest: nothing in flight anywhere.
	for _, name := range []string{"iop_provider_in_flight", "iop_provider_long_in_flight", "iop_provider_queued", "iop_runs_in_flight", "iop_queue_depth"} {
		if sum := familySum(fams, name); sum != 0 {
			t.Errorf("%s sums to %v at rest, want 0", name, sum)
		}
	}
	if n := len(fams["iop_provider_in_flight"].GetMetric()); n != 3 {
		t.Errorf("%d providers in iop_provider_in_flight, want 3", n)
	}
	if fams["go_goroutines"] == nil {
		t.Error("the Go runtime collector is missing")
	}
}
